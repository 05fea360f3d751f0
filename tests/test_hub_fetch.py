"""An id qvl has no numbers for: one try at the hub with a short timeout and no retry log (an air-gapped NPU host
got 24 s of huggingface_hub retries), and a 'did you mean' for a misspelt id instead of handing the typo back as an
`hf download` command. No network: the hub is a closed loopback port or a loopback stand-in that counts requests."""

from __future__ import annotations

import os
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


def _qvl_online(endpoint: str, home: Path, *args: str) -> subprocess.CompletedProcess:
    """qvl with the hub allowed (HF_HUB_OFFLINE unset) but pointed at ``endpoint``, and an empty HF_HOME."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HF_HUB_ETAG_TIMEOUT")
    }
    env.update({"HF_ENDPOINT": endpoint, "HF_HOME": str(home), "COLUMNS": "200", "NO_COLOR": "1"})
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
    # huggingface_hub may also fetch its agent-harness registry (GET /api/...): not an attempt at the model
    attempts = [r for r in _CountingHub.requests if r.endswith("/config.json")]
    assert attempts == [f"HEAD /{UNKNOWN}/resolve/main/config.json"], _CountingHub.requests
    assert "Retrying" not in res.stderr and "HTTP Error" not in res.stderr


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
