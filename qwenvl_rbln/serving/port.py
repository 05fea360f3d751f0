"""Whether ``--host``/``--port`` is free before ``vllm serve`` starts.

vLLM binds its socket with ``SO_REUSEPORT`` (``vllm/entrypoints/openai/api_server.py``, ``create_server_socket``),
so a second server on a port another vLLM already listens on is not refused: both listen, and the kernel spreads
new connections between them, some to a server still loading (or serving another artifact). qvl binds the
address once without ``SO_REUSEPORT`` (``SO_REUSEADDR`` only, so a port in TIME_WAIT after a stopped server still
counts as free) and closes it at once; a port any program listens on then fails with EADDRINUSE.
"""

from __future__ import annotations

import errno
import socket

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.serving.options import host_port


def check_port_free(host: str, port: int) -> None:
    """InputError naming the address when something already listens on ``host:port``; other bind errors (an
    address not on this machine, a privileged port) are left for vLLM to report."""
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
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise InputError(
                        f"--port {port}: {host_port(host, port)} is already in use (another server listens there; "
                        "vLLM would start beside it and share its connections); nothing was started",
                        f"stop that server first, or pass another --port (e.g. --port {port + 1})",
                    ) from None
