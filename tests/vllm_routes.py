"""vLLM's own route list, as its API server builds it: ``build_app`` of the installed vLLM (with its arg parser's
defaults and the ``generate`` task a Qwen3-VL serves), run in a child process over qvl's emulated ``rebel`` (vllm-rbln's
platform imports it). No server starts and no engine loads; the list is vLLM's, never one kept by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = r"""
import json, sys
from vllm.entrypoints.openai import api_server
from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "unused"])
app = api_server.build_app(args, ("generate",))
routes = []
for route in app.routes:
    methods = sorted(getattr(route, "methods", None) or ["GET"])  # a Mount (/metrics) answers GET
    routes += [[m, route.path] for m in methods if m != "HEAD"]
from vllm.entrypoints.openai.server_utils import GUARDED_PREFIX
print("QVL-ROUTES " + json.dumps({"routes": routes, "guarded_prefix": list(GUARDED_PREFIX)}))
"""


def vllm_app_routes(timeout: float = 300) -> dict:
    """``{"routes": [[method, path], ...], "guarded_prefix": [...]}`` of the installed vLLM's API server app."""
    from qwenvl_rbln.backends import emulator

    env = {**os.environ, **emulator.engine_environment(os.environ)}
    env.pop("VLLM_SERVER_DEV_MODE", None)  # qvl never sets it; its development routes are not the served app's
    env.update({"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"})
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("QVL-ROUTES ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    return json.loads(lines[-1].removeprefix("QVL-ROUTES "))
