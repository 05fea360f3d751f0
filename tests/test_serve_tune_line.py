"""tune's printed vLLM line is the one `qvl serve` runs (audit D22): both come from serving.command.vllm_launch, so the
line tune prints before anything is compiled equals `qvl serve --dry-run` on the artifact its preset compiles to."""

from __future__ import annotations

import json
import random
import shlex

from qwenvl_rbln.artifacts.manifest import write_manifest
from qwenvl_rbln.artifacts.processor_files import write_caps
from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import write_artifact
from tests.helpers_cli import run_qvl
from tests.test_serve_processor import CHECKPOINT_PROCESSOR

# unset or set from the caller's environment, not the preset
IGNORED_ENV = ("RBLN_VISIBLE_DEVICES", "VLLM_PLUGINS", "VLLM_API_KEY")


def test_tunes_vllm_line_is_serves_dry_run(tmp_path):
    rng = random.Random(3)
    sizes = [(1920, 1080), (1280, 720), (640, 480)]
    lines = [json.dumps(dict(zip(("width", "height"), rng.choice(sizes), strict=True))) for _ in range(60)]
    (tmp_path / "wl.jsonl").write_text("\n".join(lines) + "\n")
    tune = ["tune", "-w", "wl.jsonl", "--context", "32768", "--min-batch", "2", "-o", "tuned.yaml"]
    res = run_qvl(*tune, "--json", cwd=tmp_path)
    assert res.exit_code == 0, res.stderr
    cmds = json.loads(res.stdout)["commands"]

    # the artifact `qvl compile --preset tuned.yaml` writes: its graphs, its processor caps, its manifest
    plan = build_plan(str(tmp_path / "tuned.yaml"))
    root = write_artifact(tmp_path / plan.output_dir, plan)
    (root / "processor_config.json").write_text(json.dumps(CHECKPOINT_PROCESSOR))  # the checkpoint's, then capped
    write_caps(root, plan.processor.to_dict())
    manifest = {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": plan.model_id}}
    write_manifest(root, {**manifest, "processor": plan.processor.to_dict(), "runtime": plan.runtime})
    served = run_qvl("serve", plan.output_dir, "--dry-run", "--json", cwd=tmp_path)
    assert served.exit_code == 0, served.stderr
    data = json.loads(served.stdout)

    assert cmds["vllm"][2] == plan.output_dir and data["argv"][2] == str(root)
    assert cmds["vllm"][:2] + cmds["vllm"][3:] == data["argv"][:2] + data["argv"][3:]
    env = {k: v for k, v in data["env"].items() if k not in IGNORED_ENV}
    assert cmds["env"] == env and env["QVL_VIT_PACKING"] == "1"  # the audit's missing variable

    human = run_qvl(*tune, cwd=tmp_path)
    assert human.exit_code == 0, human.stderr
    (line,) = [x for x in human.stdout.splitlines() if "which runs:" in x]
    shown = " ".join(f"{k}={v}" for k, v in env.items()) + " " + shlex.join(cmds["vllm"])
    assert line.split("which runs:", 1)[1].strip() == shown
