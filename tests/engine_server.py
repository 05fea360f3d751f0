"""`qvl serve --emulate` as the engine tests run it: the real vLLM and vllm-rbln over qvl's emulated NPU, spoken to
over HTTP like a user would. Everything here is emulated: no NPU ran.

- ``start(artifact, tmp)``: `qvl serve DIR --emulate` on a free loopback port in its own session, ready when
  ``/health`` answers 200 (every wait is bounded by a condition, never a bare sleep); ``Server.stop()`` is Ctrl-C
  (SIGINT to qvl), then, whatever is left, SIGKILL to every process group it started: nothing outlives a module.
- ``infer_tokens(artifact, requests, tmp)``: `qvl infer --emulate --batch-file` on the same requests, the greedy
  tokens the engine's answers are compared with.
- Media: PNG images and mp4 videos as data URLs, the way an OpenAI client sends them.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers_cli import free_port

REPO = Path(__file__).resolve().parent.parent
START_S = 420.0  # the engine's start on a busy 2-core machine (about 30 s idle): a bound, not a wait
STOP_S = 60.0
CALL_LOG = "QVL_EMULATOR_CALL_LOG"


def installed() -> str | None:
    """Why the engine tests cannot run here (None: they can): vLLM and vllm-rbln are part of `make install`."""
    from importlib import metadata

    for dist in ("vllm", "vllm-rbln", "optimum-rbln"):
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            return f"{dist} is not installed (make install installs it)"
    if not (Path(sys.executable).parent / "vllm").is_file():
        return f"no vllm executable beside {sys.executable}"
    return None


def free_block(n: int) -> int:
    """A port whose next ``n - 1`` ports are free too (a fleet's router, engines and metrics: ``--port`` and up)."""
    for _ in range(200):
        base = free_port()
        if base + n > 65535:
            continue
        try:
            with contextlib.ExitStack() as stack:
                for port in range(base, base + n):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise AssertionError(f"no {n} free ports in a row on loopback")


def engine_env(tmp: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The test process's environment with the venv's `vllm` first on PATH, this checkout importable in every vLLM
    process, the emulator's graph-call log, and nothing that could reach the network."""
    env = {**os.environ}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env.update({CALL_LOG: str(tmp / "graph-calls.log"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    env.update({"NO_COLOR": "1", "COLUMNS": "200", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"})
    env.pop("VLLM_API_KEY", None)
    env.update(extra or {})
    return env


def descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(pids: list[int]) -> list[int]:
    """The pids still running (a zombie is not running)."""
    import psutil

    out = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
    return out


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log: Path
    env: dict[str, str]
    key: str | None = None
    started: list[int] = field(default_factory=list)  # every process of the server seen while it ran
    startup_s: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def request(
        self, path: str, body: Any = None, *, key: str | None = None, timeout: float = 300
    ) -> tuple[int, dict[str, str], Any]:
        """(status, headers, JSON answer or text) of one HTTP request; errors are answers too."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if key or self.key:
            headers["Authorization"] = f"Bearer {key or self.key}"
        req = urllib.request.Request(self.url + path, data=data, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, head, raw = resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as exc:
            status, head, raw = exc.code, dict(exc.headers), exc.read()
        try:
            return status, head, json.loads(raw) if raw else None
        except ValueError:
            return status, head, raw.decode(errors="replace")

    def chat(self, content: Any, max_tokens: int = 8, **extra: Any) -> tuple[int, dict[str, str], Any]:
        body = {
            "model": "engine",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "return_token_ids": True,
            **extra,
        }
        return self.request("/v1/chat/completions", body)

    def tokens(self, content: Any, max_tokens: int = 8) -> list[int]:
        status, _, answer = self.chat(content, max_tokens)
        assert status == 200, (status, answer)
        return answer["choices"][0]["token_ids"]

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def graph_calls(self, name: str = "compiled_model.rbln") -> int:
        """Graph calls of ``name`` the emulator logged so far (the ViT's by default), in every engine process."""
        path = Path(self.env[CALL_LOG])
        lines = path.read_text().splitlines() if path.is_file() else []
        return sum(1 for line in lines if line.split()[1:2] == [name])

    def remember_processes(self) -> None:
        self.started = sorted(set(self.started) | set(descendants(self.proc.pid)))

    def interrupt(self) -> int:
        """Ctrl-C of `qvl serve`: SIGINT to qvl alone (vLLM runs in its own session, as under a terminal qvl is the
        foreground process); qvl's exit code once it is gone, within STOP_S."""
        self.remember_processes()
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=STOP_S)

    def stop(self) -> None:
        """Ctrl-C, then SIGKILL to every process group the server started, whatever state it is in."""
        if self.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.interrupt()
        self.remember_processes()
        for pid in [self.proc.pid, *self.started]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # pid is its own group's id for qvl and for vllm (own sessions)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=STOP_S)


@contextlib.contextmanager
def serving(
    artifact: Path, tmp: Path, *args: str, env: dict[str, str] | None = None, ports: int = 1
) -> Iterator[Server]:
    """``start`` for a block (a module fixture); afterwards the server is stopped and no process of it is left."""
    server = start(artifact, tmp, *args, env=env, ports=ports)
    try:
        yield server
    finally:
        server.stop()
    assert not alive(server.started), f"the server left processes behind: {alive(server.started)}"


def start(artifact: Path, tmp: Path, *args: str, env: dict[str, str] | None = None, ports: int = 1) -> Server:
    """`qvl serve ARTIFACT --emulate`, ready (``/health`` 200), or an AssertionError with the end of its output.
    ``ports``: how many ports from ``--port`` up it takes (a fleet: the router, its engines, the router's metrics)."""
    port = free_port() if ports == 1 else free_block(ports)
    full_env = engine_env(tmp, env)
    log = tmp / f"serve-{port}.log"
    cmd = [sys.executable, "-m", "qwenvl_rbln", "serve", str(artifact), "--emulate", "--port", str(port)]
    cmd += ["--served-model-name", "engine", *args]
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, env=full_env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    server = Server(proc, port, log, full_env, key=(env or {}).get("VLLM_API_KEY"))
    try:
        while not server.healthy():
            server.remember_processes()
            assert proc.poll() is None, f"qvl serve --emulate exited with {proc.returncode}:\n{server.output()[-6000:]}"
            assert time.monotonic() - t0 < START_S, f"no /health after {START_S:.0f} s:\n{server.output()[-6000:]}"
            time.sleep(0.5)
    except BaseException:
        server.stop()
        raise
    server.startup_s = time.monotonic() - t0
    server.remember_processes()
    return server


# --------------------------------------------------------------------------------------- artifact and media

# a video budget the 4096 context holds once (serve's own limit gives video 1), over few frames, so a short video's
# frames may exceed the largest bucket: the frame cap (qvl_max_frame_pixels, 4096 patches x 16^2) must act
VIDEO_SETS = ("processor.video_max_pixels=4194304", "processor.max_frames=8")


def compile_artifact(tmp: Path) -> Path:
    """`qvl compile --preset cpu-tiny-rbln --emulate` with VIDEO_SETS: the tiny Qwen3-VL for RBLN-CR13, flash
    attention (``_requires_batch_sort``), batch 2 with decoder_batch_sizes [2, 1], ViT buckets 256/1024/4096."""
    from tests.emulated_rbln import compile_emulated

    return compile_emulated(tmp / "tiny", VIDEO_SETS)


def write_media(d: Path) -> dict[str, Path]:
    from tests.fake_media import write_noise_video, write_sweep_video

    return {
        "small": png(d / "small.png", 128, 128, seed=1),  # 256 patches: bucket 256
        "mid": png(d / "mid.png", 420, 380, seed=2),  # 624 patches: bucket 1024
        # 320 + 288 + 324 patches: three calls of bucket 1024 unpacked, one packed
        "tiny_a": png(d / "tiny_a.png", 320, 240, seed=3),
        "tiny_b": png(d / "tiny_b.png", 300, 260, seed=4),
        "tiny_c": png(d / "tiny_c.png", 280, 280, seed=5),
        "video": write_sweep_video(d / "sweep.mp4"),  # 20 frames at 8 fps: 5 sampled, 3 temporal patches
        # 2 frames of 1280x1280 within the 4194304-pixel budget: one temporal patch of 6400 patches, above the
        # largest bucket (4096) unless each frame is capped (vllm-rbln then fails "Required seq_len(6400)")
        "big_video": write_noise_video(d / "big.mp4", 1280, 1280, 2, 2),
    }


def requests_of(media: dict[str, Path]) -> dict[str, tuple[list, dict]]:
    """id -> (the chat content vLLM gets, the same request as `qvl infer --batch-file` reads it; empty: none)."""
    p = {k: str(v) for k, v in media.items()}
    return {
        "text": ([text_part("Name three colours.")], {"prompt": "Name three colours."}),
        "image": (
            [image_part(media["small"]), text_part("What is in the picture?")],
            {"prompt": "What is in the picture?", "images": [p["small"]]},
        ),
        "two-buckets": (
            [image_part(media["small"]), image_part(media["mid"]), text_part("Compare them.")],
            {"prompt": "Compare them.", "images": [p["small"], p["mid"]]},
        ),
        "three-small": (
            [*(image_part(media[k]) for k in ("tiny_a", "tiny_b", "tiny_c")), text_part("Count them.")],
            {"prompt": "Count them.", "images": [p["tiny_a"], p["tiny_b"], p["tiny_c"]]},
        ),
        "video": ([video_part(media["video"]), text_part("What moves?")], {}),  # compared by its prompt instead
    }


# ------------------------------------------------------------------------------------------------- media


def png(path: Path, width: int, height: int, seed: int = 0) -> Path:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def data_url(path: Path) -> str:
    kind = {".png": "image/png", ".mp4": "video/mp4"}[path.suffix]
    return f"data:{kind};base64,{base64.b64encode(path.read_bytes()).decode()}"


def image_part(path: Path) -> dict:
    return {"type": "image_url", "image_url": {"url": data_url(path)}}


def video_part(path: Path) -> dict:
    return {"type": "video_url", "video_url": {"url": data_url(path)}}


def text_part(text: str) -> dict:
    return {"type": "text", "text": text}


# ------------------------------------------------------------------------------------ qvl infer, the reference


def infer_tokens(
    artifact: Path, requests: dict[str, tuple[list, dict]], tmp: Path, max_tokens: int
) -> dict[str, list[int]]:
    """Greedy tokens of `qvl infer ARTIFACT --emulate --batch-file` for ``requests`` (``requests_of``: those with an
    infer form), by id."""
    batch = tmp / "infer-requests.jsonl"
    batch.write_text("".join(json.dumps({"id": rid, **infer}) + "\n" for rid, (_, infer) in requests.items() if infer))
    cmd = [sys.executable, "-m", "qwenvl_rbln", "infer", str(artifact), "--emulate", "--batch-file", str(batch)]
    cmd += ["--max-new-tokens", str(max_tokens), "--json"]
    done = subprocess.run(cmd, env=engine_env(tmp), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return {r["id"]: r["token_ids"] for r in json.loads(done.stdout)["requests"]}
