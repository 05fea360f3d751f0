"""``qvl serve --emulate`` / ``qvl bench-serve --emulate``: the real vLLM and vllm-rbln over qvl's emulated NPU.

The command is the one ``qvl serve`` builds for an NPU (same preflight, same argv), for an artifact ``qvl compile
--emulate`` wrote; only the environment differs, and nothing in it can be mistaken for an NPU result:

* ``PYTHONPATH`` starts with the emulator's ``rebel`` shim (``backends/emulator/shim``): every process vLLM starts
  imports qvl's CPU emulator as ``rebel`` (with what vllm-rbln adds to optimum-rbln's surface: ``manual_seed``,
  ``rebel.core.torch_compile``, the RBLN sampler's ops; ``backends/emulator/engine.py``). ``QVL_EMULATE_NPU=1``
  tells qvl's own code in those processes the same. That part comes from the emulator
  (``emulator.engine_environment``), composed in by the command: serving never reaches into a backend.
* every answer carries the HTTP header ``X-QVL-Emulated`` (``emulated_http.py``, through vLLM's ``--middleware``),
  and every line vLLM prints is prefixed ``qvl emulated |`` by the parent (``supervise.py``), which also keeps
  vLLM in its own process group and ends the whole group on Ctrl-C.
* it listens on loopback only, and vLLM's usage statistics are off (``VLLM_NO_USAGE_STATS``, ``DO_NOT_TRACK``): a
  development tool sends nothing off the machine.

Useful beyond tests: a client or a pipeline can be written against the exact API of the NPU deployment (same
routes, same request and answer shapes, same refusals) before an NPU is there. The tokens are the emulated graphs'
(equal to ``qvl infer --emulate``'s for a greedy request); the timings are the CPU's, never an NPU's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.serving.options import USAGE_STATS_ENV, Launch, host_port, is_loopback
from qwenvl_rbln.serving.preflight import ok

LABEL = "qvl emulated | "  # the prefix of every line vLLM prints under --emulate
HEADER = "X-QVL-Emulated"  # on every HTTP answer of the emulated server
MIDDLEWARE = "qwenvl_rbln.serving.emulated_http.EmulatedHeader"


def check_host(host: str, port: int) -> None:
    """The emulated server answers this machine only: anything but a loopback address is refused."""
    if not is_loopback(host):
        raise InputError(
            f"--emulate serves on loopback only, not --host {host} ({host_port(host, port)}): an emulated server "
            "must never be mistaken for an NPU deployment by another machine",
            "drop --host (127.0.0.1), or pass --host 127.0.0.1; serve a real NPU compile to share it",
        )


def apply(launch: Launch, emulator_env: Mapping[str, str], *, serve: bool) -> None:
    """Turn a launch into its emulated twin: the emulator's environment (``emulator.engine_environment``), vLLM's
    usage statistics off, and for ``vllm serve`` the header on every answer."""
    launch.env.update({**emulator_env, USAGE_STATS_ENV: "1", "DO_NOT_TRACK": "1"})
    launch.emulated = True
    if serve:
        launch.argv += ["--middleware", MIDDLEWARE]
    shim = str(emulator_env.get("PYTHONPATH", "")).split(os.pathsep)[0]
    ok(
        launch.checks,
        "emulated",
        f"qvl's CPU emulator stands in for rebel in every vLLM process (PYTHONPATH starts with {shim}): the "
        f"real vLLM and vllm-rbln run, the graphs are emulated; every line is prefixed '{LABEL.strip()}'"
        + (f" and every answer carries the header {HEADER}" if serve else "")
        + "; no figure from it is an NPU's",
    )
