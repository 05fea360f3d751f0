"""New-user audit 2026-12-06 H1: two `qvl serve` started about 2 s apart on overlapping ports both came up on one
engine port (vLLM binds with SO_REUSEPORT some 20 s after qvl's one-time check) and the kernel split the requests
between two deployments. Now qvl binds and listens on each port at its check and hands that socket to vLLM
(serving/port.py): the second server is refused at once, a bare vLLM bind beside it fails, and the first serves on
qvl's socket, the port's only listener. Real `qvl serve --emulate` processes and the real vLLM bind path; the engine
need not load (a stand-in artifact: vLLM adopts the socket before it builds the engine, then fails), so it is cheap.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from qwenvl_rbln.backends import emulator
from qwenvl_rbln.serving import port as qvl_port
from tests import engine_server as eng
from tests.helpers_cli import run_qvl
from tests.test_serve_emulate import emulated_artifact

ADOPTED = "qvl: vLLM serves on the socket qvl bound for"
VLLM_BIND = (
    "import sys; from vllm.entrypoints.openai.api_server import create_server_socket\n"
    "try:\n    create_server_socket(('127.0.0.1', int(sys.argv[1])))\nexcept OSError as e:\n"
    "    print('refused', e.errno); sys.exit(0)\nprint('bound'); sys.exit(1)"
)


def until(condition, what: str, timeout: float = eng.START_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def listeners(number: int) -> list[psutil.Process]:
    """Every process with a listening TCP socket on ``number`` (a socket shared by fork counts once per process)."""
    pids = {c.pid for c in psutil.net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == number}
    return [psutil.Process(pid) for pid in pids if pid]


def qvl(art: Path, tmp: Path, number: int, *args: str, log: str) -> tuple[subprocess.Popen, Path]:
    out = tmp / log
    cmd = [sys.executable, "-m", "qwenvl_rbln", "serve", str(art), "--emulate", "--port", str(number), *args]
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            cmd, env=eng.engine_env(tmp), stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    return proc, out


def stop(proc: subprocess.Popen) -> None:
    seen = [proc.pid, *eng.descendants(proc.pid)]
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    proc.wait(timeout=eng.STOP_S)
    assert not eng.alive(seen), eng.alive(seen)


def kernel_listeners(number: int) -> int:
    """Listening TCP sockets on port ``number`` as the kernel counts them (one per socket, however many processes
    share it): /proc/net/tcp and tcp6, state 0A."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            count += state == "0A" and int(local.rsplit(":", 1)[1], 16) == number
    return count


@pytest.mark.parametrize("first", ["server", "fleet"])
def test_two_servers_2s_apart_on_one_port_never_both_serve(first, tmp_path):
    art = emulated_artifact(tmp_path / "art")
    base = eng.free_block(4)
    shared = base + 2 if first == "fleet" else base  # the fleet's engine-1: router base, engines base+1, base+2
    a, a_log = qvl(art, tmp_path, base, *(["--workers", "2"] if first == "fleet" else []), log="a.log")
    try:
        until(lambda: listeners(shared) or a.poll() is not None, "A never held its port")
        time.sleep(2)  # the audit's gap: A's vLLM is still importing, long before its own bind
        b, b_log = qvl(art, tmp_path, shared, log="b.log")
        assert b.wait(timeout=120) == 2, b_log.read_text()
        (line,) = b_log.read_text().strip().splitlines()
        assert f"127.0.0.1:{shared} is already in use" in line and "nothing was started" in line, line

        def handed_over() -> bool:  # the socket is A's vLLM's alone: qvl closed its copy once vLLM had one
            family = {*eng.descendants(a.pid)}
            return bool(owners := listeners(shared)) and all(p.pid in family for p in owners)

        until(handed_over, f"A's port never went to its vLLM alone: {listeners(shared)}")
        assert kernel_listeners(shared) == 1
        adopted = f"{ADOPTED} 127.0.0.1:{shared} "  # vLLM's bind took qvl's socket
        until(lambda: adopted in a_log.read_text(errors="replace"), f"A's vLLM never adopted:\n{a_log.read_text()}")
    finally:
        stop(a)


def test_vllms_own_bind_fails_on_a_port_qvl_holds(tmp_path):
    """vLLM's create_server_socket (SO_REUSEADDR + SO_REUSEPORT), in a process of its own as a bare `vllm serve` would
    run it, against a port qvl holds: EADDRINUSE, never a second listener."""
    held = qvl_port.hold("127.0.0.1", eng.free_port())
    try:
        env = eng.engine_env(tmp_path)
        env.update(emulator.engine_environment(env))  # vllm-rbln's platform imports rebel: the emulator's shim
        bare = subprocess.run(
            [sys.executable, "-c", VLLM_BIND, str(held.port)], capture_output=True, text=True, env=env, timeout=300
        )
        last = bare.stdout.strip().splitlines()[-1:]
        assert last == ["refused 98"], (bare.stdout[-2000:], bare.stderr[-2000:])
        assert kernel_listeners(held.port) == 1
    finally:
        held.close()


def test_a_held_port_refuses_every_kind_of_bind_and_a_time_wait_port_is_free():
    held = qvl_port.hold("127.0.0.1", eng.free_port())
    try:
        assert held.sock is not None
        for reuse_port in (False, True):
            with socket.socket() as other:
                other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if reuse_port:
                    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                with pytest.raises(OSError, match="in use"):
                    other.bind(("127.0.0.1", held.port))
    finally:
        held.close()
    # a server's side of a closed connection stays in TIME_WAIT for a minute: the port is still free (audit I2)
    with socket.create_server(("127.0.0.1", 0)) as srv:
        number = srv.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", number))
        conn, _ = srv.accept()
        conn.close()  # the server closes first: its side waits
        client.recv(1)
        client.close()
    assert any(c.laddr.port == number and c.status == "TIME_WAIT" for c in psutil.net_connections("tcp"))
    qvl_port.hold("127.0.0.1", number).close()
    (fleet_port,) = qvl_port.hold_fleet([number], [eng.free_port()])
    fleet_port.close()


STAND_IN = """#!{python}
import json, os, socket, sys
fd = int(os.environ["QVL_LISTEN_FD"])
sock = socket.socket(fileno=fd)
listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
json.dump({{"port": sock.getsockname()[1], "listening": listening}}, open(sys.argv[-1], "w"))
"""


def test_an_npu_serve_execs_vllm_on_the_socket_qvl_holds(tmp_path):
    """`qvl serve` for an NPU execs vllm: the listening socket goes on into the process vLLM becomes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(STAND_IN.format(python=sys.executable))
    (bin_dir / "vllm").chmod(0o755)
    root = emulated_artifact(tmp_path / "art", emulated=False)
    record, number = tmp_path / "record.json", eng.free_port()
    env = {"PATH": f"{bin_dir}:{eng.engine_env(tmp_path)['PATH']}"}
    ran = run_qvl("serve", str(root), "--port", str(number), "--", "--tokenizer", str(record), env=env)
    assert ran.exit_code == 0, ran.stderr
    assert json.loads(record.read_text()) == {"port": number, "listening": 1}


def test_a_vllm_of_another_environment_binds_itself(tmp_path):
    """qvl's plugin is an entry point of this environment only: a `vllm` whose interpreter is another's might not
    adopt the socket, and would then fail to bind beside it. qvl falls back to its one-time check for it."""
    assert qvl_port.same_environment(str(Path(sys.executable).parent / "vllm"))
    other = tmp_path / "vllm"
    other.write_text("#!/usr/bin/env python3\n")
    assert not qvl_port.same_environment(str(other))
    held = qvl_port.hold("127.0.0.1", eng.free_port())
    assert held.sock is not None and held.for_vllm(str(other)).sock is None and not held.handoff
    with held.handed() as (env, fds):
        assert env == {} and fds == ()
    with socket.create_server(("127.0.0.1", held.port)):  # nothing of qvl's is left on the port
        pass
