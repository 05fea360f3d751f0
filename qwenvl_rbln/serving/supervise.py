"""Run vLLM as a child in its own process group: every line it prints labelled, the whole group ended with qvl.

``qvl serve`` for an NPU execs ``vllm`` (the process becomes vLLM). Under ``--emulate`` qvl stays the parent instead,
for two things exec cannot give: every line vLLM and its engine processes print starts with a label
(``emulated.LABEL``), and Ctrl-C (or SIGTERM) of ``qvl serve`` leaves no process behind: vLLM gets the SIGINT a
terminal would send it, ``GRACE_S`` to shut down, then the whole group is killed, and qvl returns only once no
process of the group is left. On Linux the child also gets SIGTERM should qvl itself die (``PR_SET_PDEATHSIG``),
and qvl is the subreaper of vLLM's engine processes, so none is left a zombie.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO

from qwenvl_rbln.errors import EXIT_INTERRUPTED, DependencyMissing
from qwenvl_rbln.serving.port import HeldPort

GRACE_S = 20.0  # vLLM's own shutdown after SIGINT (engine core, API server) before the group is killed
GONE_S = 10.0  # after SIGKILL: how long to wait for the kernel to clear the group


def _prctl(option: int, value: int) -> None:
    """Linux's prctl; nothing elsewhere (both uses are a safety net, not a requirement)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, value)
    except (OSError, AttributeError):
        pass


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    _prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: vLLM gets SIGTERM should qvl die


def _reap() -> None:
    """Collect every child that has ended (vLLM's own processes are re-parented to qvl, the subreaper)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


_ESCAPES = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]")  # terminal colour and cursor sequences (CSI)


def _pump(source: IO[bytes], sink: IO[bytes], label: bytes, watch: Callable[[bytes], None] | None = None) -> None:
    """Copy ``source`` to ``sink`` line by line, each line prefixed with ``label`` (and shown to ``watch``)."""
    for line in iter(source.readline, b""):
        line = _ESCAPES.sub(b"", line)  # vllm-router colours its log even into a pipe: no escapes in qvl's output
        if watch is not None:
            watch(line)
        with contextlib.suppress(OSError, ValueError):
            sink.write(label + line if line.endswith(b"\n") else label + line + b"\n")
            sink.flush()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


@contextlib.contextmanager
def _forwarded(on_signal) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP (the terminal closed: vLLM, in its own session, never hears it) call
    ``on_signal`` instead of raising, for the block (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, lambda *_: on_signal()) for sig in forwarded}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def spawn(
    argv: Sequence[str],
    env: Mapping[str, str],
    label: str,
    listen: HeldPort | None = None,
    watch: Callable[[bytes], None] | None = None,
) -> tuple[subprocess.Popen, list[threading.Thread]]:
    """Start ``argv`` in its own session (its pid is its group's id), its output pumped under ``label``; ``listen``:
    the port qvl holds for it, handed over as an inherited socket (``port.py``); ``watch`` sees each stdout line."""
    _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: vLLM's engine processes come back to qvl if vLLM ends first
    with listen.handed() if listen is not None else contextlib.nullcontext(({}, ())) as (extra, fds):
        proc = _popen(argv, {**env, **extra}, fds)
    pumps = [
        threading.Thread(target=_pump, args=(proc.stdout, sys.stdout.buffer, label.encode(), watch), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, sys.stderr.buffer, label.encode()), daemon=True),
    ]
    for pump in pumps:
        pump.start()
    return proc, pumps


def _popen(argv: Sequence[str], env: Mapping[str, str], fds: tuple[int, ...]) -> subprocess.Popen:
    try:
        return subprocess.Popen(
            list(argv),
            env=dict(env),
            pass_fds=fds,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own group: qvl decides when it ends, and ends all of it
            preexec_fn=_die_with_parent,
        )
    except OSError as exc:  # found but not runnable (a bad shebang, no permission): as the exec path says it
        from qwenvl_rbln.serving.launch import VLLM_INSTALL_HINT

        raise DependencyMissing(f"cannot start {argv[0]}: {exc.strerror or exc}", VLLM_INSTALL_HINT) from None


def end_group(pgid: int) -> None:
    """SIGKILL whatever is left of the group, and wait (``GONE_S`` at most) until the kernel has cleared it."""
    _kill_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + GONE_S
    while group_alive(pgid) and time.monotonic() < deadline:
        _reap()
        time.sleep(0.05)


def exit_code(returncode: int) -> int:
    """A shell's exit status: a process ended by signal N is 128 + N (SIGKILL: 137)."""
    return returncode if returncode >= 0 else 128 - returncode


def run(
    argv: Sequence[str],
    env: Mapping[str, str],
    label: str,
    listen: HeldPort | None = None,
    watch: Callable[[bytes], None] | None = None,
) -> int:
    """Run ``argv`` to its end; its exit code, or ``EXIT_INTERRUPTED`` when qvl was interrupted meanwhile.

    The signals are forwarded from before the child exists: a Ctrl-C that lands while it is being started (its
    first line may already be out: the pumps run beside this thread) is kept and sent to its group as soon as there
    is one, never a KeyboardInterrupt that leaves a started group behind."""
    interrupted: list[float] = []
    group: list[int] = []

    def on_signal() -> None:
        if not interrupted:
            interrupted.append(time.monotonic())
            for pgid in group:
                _kill_group(pgid, signal.SIGINT)  # what a terminal's Ctrl-C sends the foreground group
        else:
            for pgid in group:
                _kill_group(pgid, signal.SIGKILL)  # a second Ctrl-C: now

    with _forwarded(on_signal):
        proc, pumps = spawn(argv, env, label, listen, watch)
        group.append(proc.pid)
        try:
            if interrupted:  # a Ctrl-C while it was starting
                _kill_group(proc.pid, signal.SIGINT)
            return _supervise(proc, proc.pid, pumps, interrupted)
        except BaseException:  # any error: the group never outlives qvl
            _kill_group(proc.pid, signal.SIGKILL)
            raise


def _supervise(proc: subprocess.Popen, pgid: int, pumps: list[threading.Thread], interrupted: list[float]) -> int:
    """Wait for all of the group to end (``interrupted``: when qvl's forwarded Ctrl-C came, if it did)."""
    while proc.poll() is None:
        if interrupted and time.monotonic() - interrupted[0] > GRACE_S:
            _kill_group(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
    end_group(pgid)  # whatever of the group outlived vLLM's main process
    for pump in pumps:
        pump.join(timeout=2.0)
    if interrupted:
        return EXIT_INTERRUPTED
    return exit_code(proc.returncode)


forwarded = _forwarded  # the fleet's supervisor (fleet_run.py) forwards the same three signals
kill_group = _kill_group
