"""The documented deploy path, run as written: docs/cluster.md's commands (M5), docs/emulator.md's emulated compiles
(L6), and the Containerfile's install of qvl, which must need nothing from a package index (M6)."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from qwenvl_rbln import __version__
from qwenvl_rbln.artifacts.manifest import graph_hash, read_manifest, write_manifest
from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import run_main, write_artifact

ROOT = Path(__file__).resolve().parent.parent


def _shell_lines(block: str) -> list[str]:
    """The commands of a bash block: continuation lines joined, comments cut."""
    text = re.sub(r"\\\n\s*", " ", block)
    return [line.split("  #")[0].strip() for line in text.splitlines() if line.strip()]


def _the_path_block() -> list[str]:
    doc = (ROOT / "docs" / "cluster.md").read_text()
    section = doc.split("## The path", 1)[1]
    return _shell_lines(section.split("```bash", 1)[1].split("```", 1)[0])


def test_cluster_md_commands_name_the_secret_namespace_image_and_folder_deploy_writes(tmp_path, capsys, monkeypatch):
    """M5: the doc created Secret `qwen3-vl-api-key`, the Deployment read `qwen3-vl-2b-instruct-api-key` (a pod
    stuck in CreateContainerConfigError). The doc's own deploy command runs here on a fake artifact at its path."""
    monkeypatch.setenv("QVL_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    lines = _the_path_block()
    (deploy,) = [shlex.split(line) for line in lines if line.startswith("qvl deploy ")]
    art = Path(deploy[2])
    plan = build_plan("rebel100-1npu")
    write_artifact(art, plan)
    model = {"id": "Qwen/Qwen3-VL-2B-Instruct"}  # the served name a tuned Qwen3-VL-2B compile carries
    write_manifest(art, {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": model})
    report = deploy[deploy.index("--load-check") + 1]
    runtime = {"ok": True, "create_runtimes": True, "seconds": 95.0, "graph_hash": graph_hash(art, read_manifest(art))}
    Path(report).write_text(json.dumps({"artifact_dir": str(art), "emulated": False, "runtime": runtime}))
    code, _, err = run_main(deploy[1:], capsys)
    assert code == 0, err
    out = Path(deploy[deploy.index("-o") + 1])
    dep = yaml.safe_load((out / "deployment.yaml").read_text())
    pod = dep["spec"]["template"]["spec"]["containers"][0]
    (key,) = [e for e in pod["env"] if e["name"] == "VLLM_API_KEY"]
    namespace = yaml.safe_load((out / "kustomization.yaml").read_text())["namespace"]

    (secret,) = [shlex.split(line) for line in lines if line.startswith("kubectl create secret")]
    assert secret[4] == key["valueFrom"]["secretKeyRef"]["name"]  # kubectl create secret generic NAME ...
    assert secret[secret.index("-n") + 1] == namespace
    build = shlex.split([line for line in lines if line.startswith("podman build")][0].split("&&")[0])
    assert build[build.index("-t") + 1] == pod["image"]
    assert Path(build[build.index("-f") + 1]) == out / "Containerfile" and Path(build[-1]) == out
    (apply,) = [shlex.split(line) for line in lines if line.startswith("kubectl apply")]
    assert Path(apply[-1]) == out


def _readme_emulated_compiles() -> list[str]:
    """The compiles of the emulator page's "Emulated Rebel100" section (moved there from the README)."""
    doc = (ROOT / "docs" / "emulator.md").read_text()
    section = doc.split("## Emulated Rebel100", 1)[1].split("\n## ", 1)[0]
    return [c for c in re.findall(r"`(qvl compile [^`]*)`", section) if "--dry-run" not in c]


def test_readme_emulated_compiles_write_different_folders(tmp_path, capsys, monkeypatch):
    """L6: the 8B-shaped compile right after the section's own compile wrote the same qvl-out/cpu-tiny-rbln and
    was refused (exit 2, "already exists")."""
    monkeypatch.chdir(tmp_path)
    commands = _readme_emulated_compiles()
    assert len(commands) >= 2
    outputs = []
    for command in commands:
        code, out, err = run_main([*shlex.split(command)[1:], "--dry-run", "--json"], capsys)
        assert code == 0, (command, err)
        outputs.append(json.loads(out)["output_dir"])
    assert len(set(outputs)) == len(outputs) or all("--force" in c for c in commands[1:]), outputs


# ----------------------------------------------------------------------------------- M6: the Containerfile


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    from qwenvl_rbln.deploy.build import build
    from qwenvl_rbln.deploy.options import DeployOptions
    from qwenvl_rbln.deploy.write import write_folder

    base = tmp_path_factory.mktemp("wheel")
    plan = build_plan("rebel100-1npu")
    art = write_artifact(base / "art", plan)
    write_manifest(art, {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": "m"}})
    opts = DeployOptions(directory=art, artifact="pvc:m", image="reg.example/vllm-rbln:1", out=base / "k8s")
    result = build(opts)  # not a dry run: that builds no wheel
    return write_folder(base / "k8s", result["files"], force=False)


def test_the_containerfile_installs_only_the_wheel_beside_it(written):
    """M6: `pip install "qwenvl-rbln==0.1.0"` named a package no index has; the build context held no wheel."""
    lines = (written / "Containerfile").read_text().splitlines()
    steps = [line for line in lines if not line.startswith("#")]
    whl = f"qwenvl_rbln-{__version__}-py3-none-any.whl"
    assert (written / whl).is_file()
    (copy,) = [s for s in steps if s.startswith("COPY ")]
    (install,) = [s for s in steps if "pip install" in s]
    assert copy.split()[1] == whl
    words = shlex.split(install.split("&&")[0].removeprefix("RUN "))
    assert "--no-index" in words and "--no-deps" in words
    assert [w for w in words if not w.startswith("-")] == ["pip", "install", f"/tmp/{whl}"]  # no requirement spec
    assert not re.search(r"https?://", "\n".join(lines))  # no index host named


def test_the_wheel_installs_without_an_index_and_vllm_finds_the_plugin(written, tmp_path):
    """pip checks the wheel's RECORD (hashes, sizes) as it installs; the installed copy imports on its own and
    carries the vllm.general_plugins entry point vLLM loads. Written twice, the wheel is the same bytes."""
    from qwenvl_rbln.deploy.wheel import build_wheel

    whl = written / f"qwenvl_rbln-{__version__}-py3-none-any.whl"
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile", "--target", str(target)]
    proc = subprocess.run([*pip, str(whl)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    probe = (
        "import importlib.metadata as m, qwenvl_rbln.vllm_plugin as p, sys; "
        "eps = [e for d in m.distributions(path=[sys.argv[1]]) for e in d.entry_points "
        "if e.group == 'vllm.general_plugins']; "
        "print(p.__file__); print([(e.name, e.value) for e in eps])"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(target)}
    run = subprocess.run(  # cwd: not the checkout, whose qwenvl_rbln `python -c` would import first
        [sys.executable, "-c", probe, str(target)], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr
    where, eps = run.stdout.splitlines()
    assert where.startswith(str(target))
    assert eps == "[('qvl_vit_packing', 'qwenvl_rbln.vllm_plugin:register')]"
    with zipfile.ZipFile(io.BytesIO(whl.read_bytes())) as zf:
        names = zf.namelist()
    assert "qwenvl_rbln/configs/rebel100-1npu.yaml" in names and not [n for n in names if "__pycache__" in n]
    build_wheel.cache_clear()
    assert build_wheel() == whl.read_bytes()  # reproducible: a --force rewrite changes nothing
