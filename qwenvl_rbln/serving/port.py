"""A server's port, held by qvl from its check until vLLM serves on it: no second server can ever share it.

vLLM binds its socket with ``SO_REUSEADDR`` and ``SO_REUSEPORT`` (``vllm/entrypoints/openai/api_server.py``,
``create_server_socket``, called by ``setup_server`` after its imports, some 20 s after start) and listens only
once the engine is up (uvicorn, minutes later). Two servers on one port then both bind, both listen, and the
kernel splits the connections between them: another deployment's engine answers (audit 2026-12-06 H1). A check
that binds and closes at qvl's start leaves the whole import time open to a second server.

So qvl binds the address itself, as vLLM would (same family, same address) but **without** ``SO_REUSEPORT``,
and **listens** at once: on Linux a listening socket without ``SO_REUSEPORT`` makes every later bind of that port
fail (``SO_REUSEADDR`` or ``SO_REUSEPORT`` alike), while a bound-only one lets another ``SO_REUSEADDR`` socket bind
beside it. ``SO_REUSEADDR`` is kept so a port in TIME_WAIT after a stopped server counts as free (audit I2: a
fleet refused a port 20 s after the previous fleet had stopped). That socket is then handed to vLLM itself: the
child inherits it (``QVL_LISTEN_FD``), and qvl's vLLM plugin (``serving/vllm_plugin.py``) makes vLLM's
``create_server_socket`` return it instead of binding a new one. There is no window at all: from qvl's check to
vLLM's last request the port is one socket. What this costs: while the engine loads, a client's connection waits
in the socket's backlog instead of being refused. A server that starts first and binds the port itself is
refused at qvl's check; a bare ``vllm serve`` that bound it in the window and not yet listened fails when it
listens (EADDRINUSE), since qvl's socket is already listening there.

Without qvl's plugin in this Python environment, or with a ``vllm`` whose interpreter is another environment's (in
either case vLLM might not adopt the socket, and would then fail to bind beside it), qvl falls back to the one-time
check.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.serving.options import PLUGIN_GROUP, PLUGIN_NAME, host_port

HANDOFF_ENV = "QVL_LISTEN_FD"  # the inherited fd of the listening socket vLLM must serve on
BACKLOG = 2048  # uvicorn's default; vLLM's listen() sets its own again


def _in_use(host: str, port: int) -> InputError:
    return InputError(
        f"--port {port}: {host_port(host, port)} is already in use (another server listens there; "
        "vLLM would start beside it and share its connections); nothing was started",
        f"stop that server first, or pass another --port (e.g. --port {port + 1})",
    )


def check_port_free(host: str, port: int) -> None:
    """InputError naming the address when something already listens on ``host:port``; other bind errors (an
    address not on this machine, a privileged port) are left for vLLM to report. A one-time check: it holds
    nothing (``hold`` does)."""
    name = host.strip().strip("[]")
    try:
        found = socket.getaddrinfo(name or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError):
        return
    for family, kind, proto, _, address in found:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
                probe.listen(1)  # a bound-only socket (a vLLM still importing) lets a bind through; not a listen
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise _in_use(host, port) from None


def listen_socket(host: str, port: int) -> socket.socket | None:
    """``host:port`` bound as vLLM binds it (IPv6 family for an IPv6 literal, else IPv4) but without
    ``SO_REUSEPORT``, and listening; InputError when anything holds the port, None when the bind fails otherwise
    (vLLM reports that itself)."""
    name = host.strip()
    family = socket.AF_INET6 if _is_ipv6(name) else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((name, port))
        sock.listen(BACKLOG)
    except (OSError, UnicodeError) as exc:
        sock.close()
        if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
            raise _in_use(host, port) from None
        return None
    return sock


def _is_ipv6(name: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6, name)
    except (OSError, ValueError):
        return False
    return True


def plugin_installed() -> bool:
    """qvl's vLLM plugin is an entry point of this Python environment (so the vLLM qvl starts adopts the socket)."""
    from importlib.metadata import entry_points

    return any(ep.name == PLUGIN_NAME for ep in entry_points(group=PLUGIN_GROUP))


@dataclass
class HeldPort:
    """One server's address, held from qvl's check to every start of its vLLM (a fleet restarts its engines)."""

    host: str
    port: int
    handoff: bool = True
    sock: socket.socket | None = None
    starts: int = 0

    def hold(self) -> None:
        """Bind and listen now, unless held already; InputError when the port is taken."""
        if self.sock is not None:
            return
        if not self.handoff:
            check_port_free(self.host, self.port)
            return
        try:
            self.sock = listen_socket(self.host, self.port)
        except InputError as exc:
            if not self.starts:
                raise
            where = host_port(self.host, self.port)
            raise InputError(
                f"{where} was taken by another server while qvl restarted the engine that served there; that engine "
                "was not started again, so nothing shares its port",
                exc.hint or "",
            ) from None

    @contextlib.contextmanager
    def handed(self) -> Iterator[tuple[dict[str, str], tuple[int, ...]]]:
        """The environment and the fds for one start of vLLM (``subprocess.Popen(env=..., pass_fds=...)``); qvl's
        copy of the socket is closed once the child has its own, so the port lives and dies with the server."""
        self.hold()
        self.starts += 1
        sock, self.sock = self.sock, None
        if sock is None:
            yield {}, ()
            return
        try:
            yield {HANDOFF_ENV: str(sock.fileno())}, (sock.fileno(),)
        finally:
            sock.close()

    def for_exec(self) -> dict[str, str]:
        """The environment for ``os.execvpe``: the socket stays open (inheritable) into the process vLLM becomes."""
        self.hold()
        if self.sock is None:
            return {}
        self.sock.set_inheritable(True)
        return {HANDOFF_ENV: str(self.sock.fileno())}

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def for_vllm(self, vllm: str) -> HeldPort:
        """Keep the socket for ``vllm`` only when it runs in this Python environment (where qvl's plugin is an entry
        point); else close it and fall back to the check (a vLLM without the plugin would fail to bind beside it)."""
        if self.handoff and not same_environment(vllm):
            self.close()
            self.handoff = False
            self.hold()
        return self


def same_environment(vllm: str) -> bool:
    """``vllm`` is a console script of this interpreter's environment (its ``#!`` line names a Python in the same
    bin directory as ``sys.executable``)."""
    try:
        with open(vllm, "rb") as f:
            first = f.readline(4096)
    except OSError:
        return False
    if not first.startswith(b"#!"):
        return False
    words = first[2:].decode("utf-8", "replace").split()
    if not words:
        return False
    here = os.path.realpath(os.path.dirname(sys.executable))
    return os.path.realpath(os.path.dirname(words[0])) == here


def hold(host: str, port: int) -> HeldPort:
    """``host:port`` held for a server qvl is about to start (InputError when it is in use)."""
    held = HeldPort(host, port, handoff=plugin_installed())
    held.hold()
    return held


# ----------------------------------------------------------------------------------------- inside vLLM's process


def adopt_in_vllm(warn: Callable[[str], None]) -> None:
    """Run by qvl's plugin in vLLM's API server: serve on the socket qvl handed over (``QVL_LISTEN_FD``) instead
    of binding a new one. The variable is removed at once, so the engine processes vLLM starts never act on it.
    When the hand-over cannot be installed, the socket is closed and vLLM binds as it always does (one warning)."""
    raw = os.environ.pop(HANDOFF_ENV, None)
    if raw is None:
        return
    try:
        sock = socket.socket(fileno=int(raw))
        sock.set_inheritable(False)
    except (ValueError, OSError) as exc:
        warn(f"{HANDOFF_ENV}={raw!r} is not qvl's listening socket ({exc}); vLLM binds its port itself")
        return
    try:
        api = importlib.import_module("vllm.entrypoints.openai.api_server")
        original = api.create_server_socket
    except Exception as exc:  # noqa: BLE001 - a plugin must never stop vLLM from starting
        sock.close()
        warn(f"vLLM's server socket cannot be handed over ({type(exc).__name__}: {exc}); vLLM binds its port itself")
        return

    def create_server_socket(addr: tuple[str, int]) -> socket.socket:
        if sock.fileno() != -1 and sock.getsockname()[1] == addr[1]:
            print(
                f"qvl: vLLM serves on the socket qvl bound for {host_port(addr[0] or '0.0.0.0', addr[1])} at its "
                "port check (held since: no other server can bind that port)",
                file=sys.stderr,
                flush=True,
            )
            return sock
        sock.close()
        return original(addr)

    api.create_server_socket = create_server_socket


def hold_fleet(engine_ports: list[int], checked_ports: list[int]) -> list[HeldPort]:
    """A fleet's loopback ports: each engine's held (for every start of that engine), the others (the router's
    metrics port, the router's own behind a front door) checked; one line naming the first port in use, before
    anything starts."""
    ports = [*engine_ports, *checked_ports]
    handoff = plugin_installed()  # one look at the entry points for every engine
    held: list[HeldPort] = []
    for number in ports:
        try:
            if number in checked_ports:
                check_port_free("127.0.0.1", number)
            else:
                one = HeldPort("127.0.0.1", number, handoff=handoff)
                held.append(one)
                one.hold()
        except InputError:
            for one in held:
                one.close()
            raise InputError(
                f"port {number} on 127.0.0.1 is in use; the fleet takes ports {min(ports)}-{max(ports)} (its "
                "engines, the router's metrics and its port behind the front door, above --port); nothing was "
                "started",
                "pass another --port (the fleet uses it and the ports just above it)",
            ) from None
    return held
