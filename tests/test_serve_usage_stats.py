"""Round 5 F2: vLLM's usage statistics stay off unless the user explicitly allows them. vLLM reads only the value
"1" as an opt-out, so ``DO_NOT_TRACK=true``, an empty ``DO_NOT_TRACK`` or ``VLLM_NO_USAGE_STATS=true`` left them on
while qvl added nothing. Checked against vLLM's own ``is_usage_stats_enabled`` in a child process (no home file)."""

from __future__ import annotations

import json
import subprocess
import sys

from qwenvl_rbln.planning.plan import build_plan
from qwenvl_rbln.serving.command import plan_artifact, vllm_launch
from qwenvl_rbln.serving.engine import resolve

ORACLE = r"""
import json, os, sys
import vllm.usage.usage_lib as usage_lib
out = []
for env in json.loads(sys.stdin.read()):
    for name in ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "VLLM_DO_NOT_TRACK"):
        os.environ.pop(name, None)
    os.environ.update(env)
    usage_lib._USAGE_STATS_ENABLED = None
    out.append(usage_lib.is_usage_stats_enabled())
print("QVL-USAGE " + json.dumps(out))
"""

CASES = [  # (the user's environment, whether the user allowed usage statistics)
    ({}, False),
    ({"DO_NOT_TRACK": "true"}, False),
    ({"DO_NOT_TRACK": ""}, False),
    ({"VLLM_NO_USAGE_STATS": "true"}, False),
    ({"VLLM_NO_USAGE_STATS": "yes"}, False),
    ({"VLLM_DO_NOT_TRACK": "TRUE"}, False),
    ({"VLLM_NO_USAGE_STATS": "1"}, False),
    ({"VLLM_NO_USAGE_STATS": "0", "DO_NOT_TRACK": "true"}, False),
    ({"VLLM_NO_USAGE_STATS": "0"}, True),
    ({"VLLM_NO_USAGE_STATS": " False "}, True),
    ({"VLLM_NO_USAGE_STATS": "0", "DO_NOT_TRACK": "0"}, True),
    ({"DO_NOT_TRACK": "0"}, True),
    ({"DO_NOT_TRACK": "0", "VLLM_DO_NOT_TRACK": "1"}, False),
]


def test_usage_statistics_are_off_unless_explicitly_allowed_by_vllms_own_reading(tmp_path):
    plan = build_plan("rebel100-1npu-batch4")
    art = plan_artifact(plan, "/models/x")
    where = {"device": 0, "visual_device": 0, "source": "x", "visible": [0], "overrides": {"device": 0}}
    engine = resolve("0.11.1a1")
    envs = []
    for environ, _ in CASES:
        launch = vllm_launch(art, plan, where, environ=environ, engine=engine)
        full = launch.exec_env(environ)
        envs.append({k: full[k] for k in ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "VLLM_DO_NOT_TRACK") if k in full})
    done = subprocess.run(
        [sys.executable, "-c", ORACLE],
        input=json.dumps(envs),
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": ":".join(sys.path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("QVL-USAGE ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    enabled = json.loads(lines[-1].removeprefix("QVL-USAGE "))
    assert enabled == [allowed for _, allowed in CASES], list(zip(CASES, enabled, strict=True))
