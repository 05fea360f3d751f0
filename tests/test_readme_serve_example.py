"""New-user audit 2026-12-04b N4: the README's curl example sent "model": "Qwen/Qwen3-VL-2B-Instruct" to the server
its own line starts (`qvl compile --preset cpu-tiny-rbln --emulate && qvl serve --emulate`), which serves the tiny
model under its folder's name: 404. The example (now in docs/serving.md; the line is also the README's quick start)
has its name checked against the name serve gives that artifact."""

from __future__ import annotations

import json
import re

from qwenvl_rbln.planning.plan import build_plan
from qwenvl_rbln.serving.command import plan_artifact, served_name
from tests.fakes_rbln import run_main
from tests.helpers_cli import REPO
from tests.test_serve_emulate import emulated_artifact


def compiled_like(plan, root):
    """An emulated artifact whose manifest names the model as `qvl compile` records it (the plan's model id)."""
    from qwenvl_rbln.artifacts.manifest import MANIFEST_NAME, write_manifest

    emulated_artifact(root)
    manifest = json.loads((root / MANIFEST_NAME).read_text())
    write_manifest(root, {**manifest, "model": {"id": plan.model_id}})
    return root


def readme_example() -> tuple[str, str]:
    """(the preset of the emulated serve line, the model name the curl example sends). The README's quick start and
    docs/serving.md both carry the line; the curl example is in docs/serving.md, beside the line it answers."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    text = (REPO / "docs" / "serving.md").read_text(encoding="utf-8")
    line = r"qvl compile --preset (\S+) --emulate --force && qvl serve --emulate"  # --force: `make demo` compiled it
    presets = re.findall(line, readme) + re.findall(line, text)
    assert len(presets) >= 3, presets  # the README's line, the page's block, and the sentence before its curl
    (preset,) = set(presets)
    section = text[text.index("## The real engine on the emulated NPU") :]
    block = section[section.index("```bash\ncurl") :]
    block = block[: block.index("\n```", 4)]
    (model,) = re.findall(r'"model": "([^"]+)"', block)
    return preset, model


def test_the_readmes_curl_example_names_the_model_serve_serves(tmp_path, capsys):
    preset, model = readme_example()
    plan = build_plan(preset)
    assert served_name(plan_artifact(plan, plan.output_dir)) == model
    art = compiled_like(plan, tmp_path / plan.output_dir.rsplit("/", 1)[-1])  # the folder compile writes
    code, out, err = run_main(["serve", str(art), "--emulate", "--dry-run", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["argv"][data["argv"].index("--served-model-name") + 1] == model
    (check,) = [c for c in data["checks"] if c["check"] == "served name"]
    assert f'"model": "{model}"' in check["detail"] and "folder's name" in check["detail"]
