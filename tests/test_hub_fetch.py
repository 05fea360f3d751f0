"""An id qvl has no numbers for: one try at the hub with a short timeout and no retry log (an air-gapped NPU host
got 24 s of huggingface_hub retries), and a 'did you mean' for a misspelt id instead of handing the typo back as an
`hf download` command. No network: the hub is a closed loopback port or a loopback stand-in that counts requests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_8B
from tests.fakes_rbln import config_of, run_main
from tests.test_family import hub_cache, make_hub_cache  # noqa: F401 - hub_cache is a fixture

REPO = Path(__file__).resolve().parents[1]
UNKNOWN = "acme/Qwen3-VL-Unknown"


def _qvl_online(
    endpoint: str, home: Path, *args: str, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """qvl with the hub allowed (HF_HUB_OFFLINE unset) but pointed at ``endpoint``, and an empty HF_HOME."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HF_HUB_ETAG_TIMEOUT")
    }
    env.update({"HF_ENDPOINT": endpoint, "HF_HOME": str(home), "COLUMNS": "200", "NO_COLOR": "1", **(extra_env or {})})
    return subprocess.run(
        [sys.executable, "-m", "qwenvl_rbln", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def test_an_unreachable_hub_is_tried_once_without_a_retry_log(tmp_path: Path):
    """D12: a closed loopback port answers at once; qvl must not retry it five times with back-off."""
    res = _qvl_online("http://127.0.0.1:9", tmp_path, "compile", "-p", "rebel100-1npu", "--model", UNKNOWN, "--dry-run")
    assert res.returncode == 2, res.stderr
    assert "Retrying" not in res.stderr and "thrown while requesting" not in res.stderr
    assert "the hub did not answer (ConnectError; one try, 2 s timeout)" in res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr


class _CountingHub(BaseHTTPRequestHandler):
    """A hub stand-in that answers every request 503 (a status huggingface_hub retries) and counts them."""

    requests: list[str] = []

    def _answer(self) -> None:
        type(self).requests.append(f"{self.command} {self.path}")
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET = _answer

    def log_message(self, *args: object) -> None:
        pass


def test_a_failing_hub_gets_exactly_one_request(tmp_path: Path):
    """D12: the number of attempts, counted by the stand-in (huggingface_hub alone made 6 or more)."""
    _CountingHub.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CountingHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        res = _qvl_online(endpoint, tmp_path, "compile", "-p", "rebel100-1npu", "--model", UNKNOWN, "--dry-run")
    finally:
        server.shutdown()
        server.server_close()
    assert res.returncode == 2, res.stderr
    # not even huggingface_hub's agent-harness registry (GET /api/agent-harnesses): telemetry is off for the fetch
    assert _CountingHub.requests == [f"HEAD /{UNKNOWN}/resolve/main/config.json"]
    assert "Retrying" not in res.stderr and "HTTP Error" not in res.stderr


def _requests_queued(listener: socket.socket) -> list[str]:
    """The request line of every connection waiting in ``listener``'s backlog (its clients have exited)."""
    listener.setblocking(False)
    lines = []
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return lines
        with conn:
            conn.setblocking(True)
            conn.settimeout(30)  # a guard, not a measurement: the client is gone, so recv returns at once
            data = b""
            while b"\r\n" not in data and (chunk := conn.recv(4096)):
                data += chunk
        lines.append(data.split(b"\r\n", 1)[0].decode().removesuffix(" HTTP/1.1"))


def test_a_hub_that_never_answers_gets_one_request_within_one_deadline(tmp_path: Path):
    """N3: a port that accepts and never answers took 5.5 s for "one try, 2 s timeout": before the HEAD,
    huggingface_hub's headers fetched its agent-harness registry (GET /api/agent-harnesses, its own 3 s timeout).
    The kernel accepts for the listener (its backlog: the client's connect succeeds) and nobody ever answers; once
    qvl has exited, the test reads what each queued connection asked. Wall time is not asserted (no timing tests):
    2.0 s for the fetch, ~2.5 s for the command, where it was 5.5 s."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
        res = _qvl_online(endpoint, tmp_path, "compile", "-p", "rebel100-1npu", "--model", UNKNOWN, "--dry-run")
        asked = _requests_queued(listener)
    assert res.returncode == 2, res.stderr
    assert asked == [f"HEAD /{UNKNOWN}/resolve/main/config.json"]
    assert "the hub did not answer within 2 s (one try; HF_HUB_ETAG_TIMEOUT sets the limit)" in res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr


def test_the_deadline_bounds_the_whole_fetch_not_each_phase(monkeypatch):
    """N3: httpx's timeouts are per phase (connect, each read; a name lookup has none), so a reply that trickles in
    outlasts them. fetch_config returns at its one deadline while the request is still blocked (a stand-in that
    waits for the test to release it), and says so."""
    import huggingface_hub

    from qwenvl_rbln.planning.catalogue import hub

    release = threading.Event()

    def stuck_metadata(url, **kwargs):
        release.wait(20)  # the test releases it; 20 s only so a broken deadline fails instead of hanging

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_ETAG_TIMEOUT", raising=False)
    monkeypatch.setattr(hub, "HUB_TIMEOUT_S", 0.05)  # huggingface_hub takes only whole seconds from the variable
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", stuck_metadata)
    downloads: list[str] = []
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo_id, *a, **k: downloads.append(repo_id))
    try:
        snap, why = hub.fetch_config(UNKNOWN)
        still_waiting = not release.is_set()
    finally:
        release.set()
    assert snap is None and still_waiting
    assert why.endswith("the hub did not answer within 0.05 s (one try; HF_HUB_ETAG_TIMEOUT sets the limit)")


def test_a_fractional_etag_timeout_is_named_not_reported_as_a_silent_hub(tmp_path: Path):
    """huggingface_hub cannot be imported with HF_HUB_ETAG_TIMEOUT=0.5 (it reads the variable with int()): the
    refusal names the variable, its value and the fix, and no request is made (the closed port is never asked)."""
    env_timeout = {"HF_HUB_ETAG_TIMEOUT": "0.5"}
    res = _qvl_online(
        "http://127.0.0.1:9",
        tmp_path,
        "compile",
        "-p",
        "rebel100-1npu",
        "--model",
        UNKNOWN,
        "--dry-run",
        extra_env=env_timeout,
    )
    assert res.returncode == 2, res.stderr
    assert "HF_HUB_ETAG_TIMEOUT='0.5' is not a whole number of seconds" in res.stderr
    assert "fix: HF_HUB_ETAG_TIMEOUT=2, or unset it" in res.stderr
    assert res.stderr.count("\n") == 1 and "Error importing" not in res.stderr


def test_a_misspelt_id_gets_did_you_mean_not_the_typo_to_download(capsys):
    """D23: the nearest built-in id; the typo is never offered as `hf download`."""
    code, _, err = run_main(
        ["compile", "-p", "rebel100-1npu", "--model", "Qwen/Qwen3-VL-8B-Instrcut", "--dry-run"], capsys
    )
    assert code == 2
    assert "did you mean --model Qwen/Qwen3-VL-8B-Instruct?" in err and "hf download" not in err


def test_a_trailing_slash_is_named(capsys):
    code, _, err = run_main(
        ["compile", "-p", "rebel100-1npu", "--model", "Qwen/Qwen3-VL-8B-Instruct/", "--dry-run"], capsys
    )
    assert code == 2
    assert "trailing slash" in err and "did you mean --model Qwen/Qwen3-VL-8B-Instruct?" in err
    assert "hf download" not in err


def test_a_misspelt_cached_id_is_matched_too(hub_cache, capsys):  # noqa: F811 - the fixture
    make_hub_cache(hub_cache, "acme/Qwen3-VL-Custom", config_of(QWEN3_VL_8B))
    code, _, err = run_main(["compile", "-p", "rebel100-1npu", "--model", "acme/Qwen3-VL-Custon", "--dry-run"], capsys)
    assert code == 2 and "did you mean --model acme/Qwen3-VL-Custom?" in err


def test_an_unrelated_id_keeps_the_download_hint(capsys):
    code, _, err = run_main(["compile", "-p", "rebel100-1npu", "--model", UNKNOWN, "--dry-run"], capsys)
    assert code == 2 and f"hf download {UNKNOWN} config.json" in err and "did you mean" not in err
