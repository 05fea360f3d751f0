"""New-user audit 2026-12-04b N3: a second `qvl serve` on a port already in use started beside the first (vLLM binds
with SO_REUSEPORT, so both listened and shared the connections). Now refused before anything starts, with a real
listening socket bound as vLLM binds it (no engine needed)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest

from qwenvl_rbln.serving.port import check_port_free
from tests.fakes_rbln import run_main
from tests.test_serve_emulate import emulated_artifact


@contextlib.contextmanager
def listening(host: str = "127.0.0.1", *, reuse_port: bool = True) -> Iterator[int]:
    """A listening socket on a free port, with vLLM's options (api_server.py create_server_socket)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, 0))
        sock.listen(16)
        yield sock.getsockname()[1]


@pytest.fixture
def no_start(monkeypatch):
    monkeypatch.setattr("os.execvpe", lambda *a, **k: pytest.fail("exec attempted"))
    monkeypatch.setattr("qwenvl_rbln.commands.serve_cmd._supervised", lambda *a, **k: pytest.fail("vLLM started"))


@pytest.mark.parametrize("emulate", [False, True])
def test_a_port_another_server_listens_on_is_refused_before_anything_starts(emulate, tmp_path, capsys, no_start):
    art = emulated_artifact(tmp_path / "art", emulated=emulate)
    with listening() as port:
        args = ["serve", str(art), "--port", str(port), *(["--emulate"] if emulate else [])]
        code, out, err = run_main(args, capsys)
        assert code == 2 and out == "" and "Traceback" not in err, err
        (line,) = err.strip().splitlines()
        assert f"127.0.0.1:{port} is already in use" in line and "nothing was started" in line
        assert f"--port {port + 1}" in line
        code, out, err = run_main([*args, "--dry-run"], capsys)  # a line to read or run elsewhere: not refused
        assert code == 0, err


@pytest.mark.parametrize(("held", "asked"), [("0.0.0.0", "127.0.0.1"), ("127.0.0.1", "0.0.0.0")])
def test_any_listener_on_the_port_counts_whatever_its_address_or_options(held, asked):
    with listening(held, reuse_port=False) as port, pytest.raises(Exception, match="already in use"):
        check_port_free(asked, port)


def test_a_port_whose_listener_has_closed_passes():
    with listening() as port:
        pass
    check_port_free("127.0.0.1", port)
    check_port_free("localhost", port)
