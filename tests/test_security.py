"""Security properties: safe YAML only, no writes outside the chosen output directory, no remote code, no
unpickling.

Each scan of the source has a positive control (a snippet it must flag), so a scanner that silently finds
nothing is itself a failing test; each behavioural test uses a live payload (one that does act when loaded
the unsafe way) and checks that qvl's way leaves no trace.
"""

from __future__ import annotations

import ast
import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from qwenvl_rbln.artifacts.manifest import MANIFEST_NAME, manifest_for_plan, sha256_file, unsafe_relpath, write_manifest
from qwenvl_rbln.errors import InputError, QvlError
from qwenvl_rbln.planning.plan import build_plan
from qwenvl_rbln.planning.presets import load_preset
from tests.fakes_rbln import TINY_CONFIG, install, make_auto, run_main, write_hf_model
from tests.helpers_cli import REPO, run_qvl

PACKAGE = REPO / "qwenvl_rbln"
SOURCES = sorted(PACKAGE.rglob("*.py"))


# ===================================================================================== safe YAML only


def _tag_payloads(marker: Path) -> dict[str, str]:
    touch = f"!!python/object/apply:builtins.open ['{marker}', 'w']"  # creates the marker when constructed
    return {
        "object/apply": f"description: {touch}\n",
        "object/new": f"description: !!python/object/new:pathlib.PosixPath ['{marker}']\n",
        "name": "description: !!python/name:os.system\n",
        "module": "description: !!python/module:os\n",
        "object": "description: !!python/object:argparse.Namespace {a: 1}\n",
        "nested in rbln_config": f"extends: rebel100-1npu\nrbln_config:\n  quantization:\n    x: {touch}\n",
    }


@pytest.mark.parametrize("kind", list(_tag_payloads(Path("m"))))
def test_python_yaml_tags_are_refused_and_never_executed(tmp_path, kind):
    marker = tmp_path / "pwned"
    text = _tag_payloads(marker)[kind]
    path = tmp_path / "evil.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_preset(str(path))
    line = info.value.one_line()
    assert "YAML tag not allowed" in line and "evil.yaml" in line and info.value.hint
    assert not marker.exists()
    # through extends: a preset that only points at the evil one is refused the same way
    child = tmp_path / "child.yaml"
    child.write_text(f"extends: {path}\n")
    with pytest.raises(InputError, match="YAML tag not allowed"):
        load_preset(str(child))
    assert not marker.exists()


def test_the_yaml_payload_is_live_under_an_unsafe_loader(tmp_path):
    """Positive control: the same text does run code with yaml.unsafe_load, so the test above can fail."""
    marker = tmp_path / "pwned"
    yaml.unsafe_load(_tag_payloads(marker)["object/apply"])["description"].close()
    assert marker.exists()


def test_python_yaml_tag_through_the_cli_exit_2_one_line(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.yaml"
    path.write_text(_tag_payloads(marker)["nested in rbln_config"])
    r = run_qvl("compile", "--preset", str(path), "--dry-run")
    assert r.exit_code == 2 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "YAML tag not allowed" in r.stderr
    assert not marker.exists()


# =========================================================================================== AST scans


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "jsonpickle", "joblib"}
YAML_UNSAFE = {
    "load",
    "load_all",
    "unsafe_load",
    "unsafe_load_all",
    "full_load",
    "full_load_all",
    "Loader",
    "UnsafeLoader",
    "FullLoader",
}


def scan(source: str, filename: str = "<snippet>") -> list[str]:
    """Every unsafe deserialisation, code execution or remote-code switch in ``source``, as 'file:line: what'."""
    found: list[str] = []
    tree = ast.parse(source, filename)

    def hit(node: ast.AST, what: str) -> None:
        found.append(f"{filename}:{getattr(node, 'lineno', '?')}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names]
            mod = node.module if isinstance(node, ast.ImportFrom) else None
            for name in [mod, *names] if mod else names:
                if name and name.split(".")[0] in UNSAFE_MODULES:
                    hit(node, f"imports {name}")
            if mod == "yaml" and set(names) & YAML_UNSAFE:
                hit(node, f"from yaml import {', '.join(sorted(set(names) & YAML_UNSAFE))}")
            if mod == "torch" and "load" in names:
                hit(node, "from torch import load")
        if isinstance(node, ast.Attribute) and _dotted(node.value) == "yaml" and node.attr in YAML_UNSAFE:
            hit(node, f"yaml.{node.attr}")
        if not isinstance(node, ast.Call):
            continue
        func = _dotted(node.func)
        kwargs = {k.arg: k.value for k in node.keywords if k.arg}
        splat = any(k.arg is None for k in node.keywords)
        if isinstance(node.func, ast.Name) and node.func.id in ("eval", "exec"):
            hit(node, f"{node.func.id}(...)")
        if func == "torch.load" or func.endswith(".torch.load"):
            wo = kwargs.get("weights_only")
            if not (isinstance(wo, ast.Constant) and wo.value is True):
                hit(node, "torch.load without weights_only=True")
        if func in ("numpy.load", "np.load"):
            ap = kwargs.get("allow_pickle")
            if ap is not None and not (isinstance(ap, ast.Constant) and ap.value is False):
                hit(node, f"{func} with allow_pickle")
        if func.endswith("from_pretrained"):
            trc = kwargs.get("trust_remote_code")
            if trc is not None and not (isinstance(trc, ast.Constant) and trc.value in (False, None)):
                hit(node, f"{func}(trust_remote_code={ast.unparse(trc)})")
            if splat:
                hit(node, f"{func}(**kwargs) could carry trust_remote_code")
        if func.startswith("subprocess.") and isinstance(kwargs.get("shell"), ast.Constant) and kwargs["shell"].value:
            hit(node, f"{func}(shell=True)")
    return found


BAD_SNIPPET = textwrap.dedent(
    """
    import pickle, yaml, torch
    from yaml import FullLoader
    import marshal as m
    pickle.loads(b"")
    yaml.load(text)
    yaml.load(text, Loader=yaml.Loader)
    yaml.unsafe_load(text)
    torch.load("x.pth")
    torch.load("x.pth", weights_only=False)
    np.load("x.npy", allow_pickle=True)
    eval("1 + 1")
    exec("x = 1")
    AutoModel.from_pretrained(p, trust_remote_code=True)
    AutoProcessor.from_pretrained(p, **kw)
    subprocess.run(cmd, shell=True)
    """
)
GOOD_SNIPPET = textwrap.dedent(
    """
    import yaml, torch, json
    yaml.safe_load(text)
    yaml.safe_dump(data)
    torch.load("x.pth", weights_only=True)
    model.eval()
    json.loads(text)
    AutoModel.from_pretrained(p, local_files_only=True)
    AutoModel.from_pretrained(p, trust_remote_code=False)
    subprocess.run([sys.executable, "-c", code])
    """
)


def test_the_scanner_flags_every_unsafe_pattern_and_nothing_safe():
    """Positive and negative controls for the scans below."""
    found = scan(BAD_SNIPPET)
    for needle in (
        "imports pickle",
        "from yaml import FullLoader",
        "imports marshal",
        "yaml.load",
        "yaml.Loader",
        "yaml.unsafe_load",
        "torch.load without weights_only=True",
        "np.load with allow_pickle",
        "eval(...)",
        "exec(...)",
        "trust_remote_code=True",
        "(**kwargs) could carry trust_remote_code",
        "shell=True",
    ):
        assert any(needle in f for f in found), (needle, found)
    assert sum("torch.load without" in f for f in found) == 2
    assert scan(GOOD_SNIPPET) == []


def test_qvl_source_has_no_unsafe_loading_no_eval_and_no_remote_code():
    assert len(SOURCES) > 20  # the scan really walks the package
    found = [f for path in SOURCES for f in scan(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))]
    assert found == []


def test_every_torch_load_in_qvl_uses_weights_only():
    """No qvl module unpickles anything: there is no torch.load at all today, and any future one must say
    weights_only=True (the scan above fails otherwise); the only .pth files (optimum-rbln's torch_artifacts.pth)
    are hashed as bytes, see the behavioural test below."""
    calls = [path for path in SOURCES if "torch.load" in path.read_text(encoding="utf-8")]
    for path in calls:
        assert not [f for f in scan(path.read_text(encoding="utf-8"), str(path)) if "torch.load" in f]


def test_every_from_pretrained_call_is_local_only_and_never_trusts_remote_code():
    """Every transformers/optimum from_pretrained in qvl: no trust_remote_code, no **kwargs that could add it."""
    calls = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and _dotted(node.func).endswith("from_pretrained"):
                calls.append((path.as_posix(), node))
    assert len(calls) >= 5, [c[0] for c in calls]  # rbln compile + load, torch load, reference, processor
    for name, node in calls:
        keys = {k.arg for k in node.keywords}
        assert None not in keys and "trust_remote_code" not in keys, (name, node.lineno)
        if not name.endswith("backends/rbln/optimum.py"):  # transformers calls: never the hub
            kw = {k.arg: k.value for k in node.keywords}
            assert isinstance(kw.get("local_files_only"), ast.Constant) and kw["local_files_only"].value is True, (
                name,
                node.lineno,
            )


# ================================================================ trust_remote_code, behaviourally


class _Stop(Exception):
    pass


def test_transformers_loaders_get_no_trust_remote_code(tmp_path, monkeypatch):
    """Record the kwargs of every transformers loader qvl calls (each stops right there)."""
    transformers = pytest.importorskip("transformers")
    from qwenvl_rbln.backends import torch_ref_compile
    from qwenvl_rbln.inference import inputs, reference

    seen: list[tuple[str, dict]] = []
    for cls_name in (
        "AutoModelForImageTextToText",
        "AutoProcessor",
        "Qwen3VLForConditionalGeneration",
        "AutoTokenizer",
        "AutoConfig",
        "AutoImageProcessor",
    ):
        cls = getattr(transformers, cls_name)

        def record(*args, _name=cls_name, **kwargs):
            seen.append((_name, kwargs))
            raise _Stop

        monkeypatch.setattr(cls, "from_pretrained", record)
    model = write_hf_model(tmp_path / "tiny", TINY_CONFIG)
    plan = build_plan("cpu-tiny", model=str(model))
    for call in (
        lambda: torch_ref_compile.load_model(model),
        lambda: reference.load_reference(model),
        lambda: inputs.load_processor(model, plan.processor),
    ):
        with pytest.raises((QvlError, _Stop)):
            call()
    assert {name for name, _ in seen} >= {
        "AutoModelForImageTextToText",
        "AutoProcessor",
        "Qwen3VLForConditionalGeneration",
    }
    for name, kwargs in seen:
        assert not kwargs.get("trust_remote_code"), (name, kwargs)
        assert kwargs.get("local_files_only") is True, (name, kwargs)


def test_optimum_rbln_calls_get_no_trust_remote_code(tmp_path, monkeypatch, capsys):
    model = write_hf_model(tmp_path / "Qwen3-VL-2B-Instruct")
    plan = build_plan("rebel100-1npu", model=str(model))
    auto = make_auto(plan)
    install(monkeypatch, auto)
    out = tmp_path / "out"
    code, _, err = run_main(
        ["compile", "--preset", "rebel100-1npu", "--model", str(model), "-o", str(out), "--no-cache"], capsys
    )
    assert code == 0, err
    code, _, err = run_main(["load-check", str(out)], capsys)
    assert code == 0, err
    assert [c["export"] for c in auto.calls] == [True, False]
    for call in auto.calls:
        assert "trust_remote_code" not in call["kwargs"] and "trust_remote_code" not in (call["rbln_config"] or {})


_REMOTE_CODE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    model, marker = Path({model!r}), Path({marker!r})
    out = {{}}
    from qwenvl_rbln.backends import torch_ref_compile
    from qwenvl_rbln.inference import inputs, reference
    from qwenvl_rbln.planning.plan import build_plan
    from qwenvl_rbln.errors import QvlError
    caps = build_plan("cpu-tiny").processor
    for name, call in (("torch_ref_compile.load_model", lambda: torch_ref_compile.load_model(model)),
                       ("reference.load_reference", lambda: reference.load_reference(model)),
                       ("inputs.load_processor", lambda: inputs.load_processor(model, caps))):
        try:
            call()
            result = "loaded"
        except QvlError as exc:
            result = "refused: " + exc.one_line()
        out[name] = [result, marker.exists()]
    # positive control: transformers itself runs the module when asked to trust it
    from transformers import AutoConfig
    try:
        AutoConfig.from_pretrained(str(model), trust_remote_code=True, local_files_only=True)
    except Exception as exc:
        out["control_error"] = repr(exc)[:300]
    out["control"] = marker.exists()
    print(json.dumps(out))
    """
)


def test_remote_code_in_a_model_directory_never_runs(tmp_path):
    """A model directory whose config.json points at its own Python (auto_map): qvl's loaders must not run it."""
    pytest.importorskip("transformers")
    import shutil

    from qwenvl_rbln.backends.tiny.model import ensure_tiny_model

    model = tmp_path / "evil-model"
    shutil.copytree(ensure_tiny_model(), model)
    marker = tmp_path / "remote-code-ran"
    payload = f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
    payload += "from transformers import Qwen3VLConfig as EvilConfig\n"
    payload += "from transformers import Qwen3VLForConditionalGeneration as EvilModel\n"
    (model / "evil.py").write_text(payload)
    cfg = json.loads((model / "config.json").read_text())
    cfg["auto_map"] = {
        "AutoConfig": "evil.EvilConfig",
        "AutoModelForImageTextToText": "evil.EvilModel",
        "AutoProcessor": "evil.EvilConfig",
    }
    (model / "config.json").write_text(json.dumps(cfg))
    for name in ("processor_config.json", "tokenizer_config.json"):
        if (model / name).is_file():
            data = json.loads((model / name).read_text())
            data["auto_map"] = {"AutoProcessor": "evil.EvilConfig", "AutoTokenizer": ["evil.EvilConfig", None]}
            (model / name).write_text(json.dumps(data))
    script = _REMOTE_CODE_SCRIPT.format(repo=str(REPO), model=str(model), marker=str(marker))
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("torch_ref_compile.load_model", "reference.load_reference", "inputs.load_processor"):
        result, ran = out[name]
        assert ran is False, (name, result)
    assert out["control"] is True, out  # the payload is live: trusting the directory does run it


# ================================================================================== nothing unpickled


class _Payload:
    """Unpickling this creates ``path`` (open(path, 'w')): proof that something was unpickled."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_a_malicious_pth_in_an_artifact_is_hashed_never_unpickled(tmp_path, monkeypatch, capsys):
    from tests.fakes_rbln import write_artifact

    marker = tmp_path / "unpickled"
    blob = pickle.dumps(_Payload(marker))
    plan = build_plan("rebel100-1npu")
    out = write_artifact(tmp_path / "art", plan)
    for rel in ("torch_artifacts.pth", "visual/torch_artifacts.pth"):
        (out / rel).write_bytes(blob)
    write_manifest(out, manifest_for_plan(plan, model={"id": "x"}, versions={}, cache_key=None))
    code, _, err = run_main(["load-check", str(out), "--no-runtime"], capsys)
    assert code == 0, err  # hashed and verified against the manifest ...
    (out / "torch_artifacts.pth").write_bytes(blob + b".")
    code, _, err = run_main(["load-check", str(out), "--no-runtime"], capsys)
    assert code == 2 and "torch_artifacts.pth" in err  # ... and its edit detected, all without unpickling it
    assert not marker.exists()
    pickle.loads(blob).close()  # positive control: the payload is live
    assert marker.exists()


# ======================================================== writes stay inside the chosen output directory


def _snapshot(*roots: Path) -> set[str]:
    out = set()
    for root in roots:
        if root.exists():
            out |= {str(p) for p in root.rglob("*")}
    return out


def test_compile_writes_only_the_output_dir_its_siblings_and_the_cache(tmp_path, capsys):
    """Everything a compile creates: OUT/..., .OUT.qvl-* beside it (lock, staging), and the cache dir."""
    home = Path(os.environ["QVL_HOME"])
    model = write_hf_model(tmp_path / "models" / "tiny", TINY_CONFIG)
    index = {"weight_map": {"a": "../../../escape.safetensors"}}
    (model / "notes").mkdir()
    (model / "notes" / "index.json").write_text(json.dumps(index))  # names that point outside, as data
    preset = tmp_path / "presets" / "p.yaml"
    preset.parent.mkdir()
    preset.write_text("extends: cpu-tiny\noutput_dir: ../../escape-out\n")
    work = tmp_path / "work"
    work.mkdir()
    before = _snapshot(tmp_path, home)
    out, cache = work / "out", work / "cache"
    code, _, err = run_main(
        ["compile", "--preset", str(preset), "--model", str(model), "-o", str(out), "--cache-dir", str(cache)], capsys
    )
    assert code == 0, err
    created = _snapshot(tmp_path, home) - before
    allowed = (str(out), str(cache), str(work / ".out.qvl-"), str(home / "locks"), str(home / "last-compile"))
    assert created and all(p.startswith(allowed) for p in created), sorted(
        p for p in created if not p.startswith(allowed)
    )
    assert not (tmp_path / "escape-out").exists() and not (tmp_path.parent / "escape.safetensors").exists()
    names = json.loads((out / MANIFEST_NAME).read_text())["files"]
    assert names and all(not unsafe_relpath(n) for n in names)  # manifest names are plain relative


@pytest.mark.parametrize("value", ["../../escape", "/tmp/qvl-escape-abs", "ok/../../escape", "~/qvl-escape"])
def test_a_preset_file_cannot_send_output_outside_the_working_directory(tmp_path, value):
    """A preset file's output_dir must be a relative path below the working directory; -o and --set choose any."""
    preset = tmp_path / "p.yaml"
    preset.write_text(f"extends: cpu-tiny\noutput_dir: {value}\n")
    with pytest.raises(InputError) as info:
        build_plan(str(preset))
    line = info.value.one_line()
    assert "p.yaml" in line and "output_dir" in line and "-o" in line, line
    assert build_plan(str(preset), output_dir=value).output_dir == value  # chosen on the command line: fine
    assert build_plan(str(preset), [f"output_dir={value}"]).output_dir == value
    assert build_plan("cpu-tiny").output_dir == "qvl-out/cpu-tiny"


@pytest.mark.parametrize("entry", ["../../outside.bin", "/etc/hostname", "a/../../outside.bin", "~/x"])
def test_a_manifest_naming_paths_outside_the_artifact_is_refused_not_read(tmp_path, capsys, monkeypatch, entry):
    from qwenvl_rbln.artifacts import manifest as manifest_module

    model = write_hf_model(tmp_path / "tiny", TINY_CONFIG)
    out = tmp_path / "art" / "out"
    code, _, err = run_main(
        ["compile", "--preset", "cpu-tiny", "--model", str(model), "-o", str(out), "--no-cache"], capsys
    )
    assert code == 0, err
    outside = tmp_path / "art" / "outside.bin"
    outside.write_bytes(b"secret")
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    manifest["files"][entry] = {"sha256": sha256_file(outside), "size": 6}
    (out / MANIFEST_NAME).write_text(json.dumps(manifest))
    opened: list[str] = []
    real = sha256_file
    # verify_manifest looks sha256_file up in its own module
    monkeypatch.setattr(manifest_module, "sha256_file", lambda p, *a: opened.append(str(p)) or real(p, *a))
    code, _, err = run_main(["load-check", str(out), "--no-runtime"], capsys)
    assert code == 2, err
    line = [ln for ln in err.splitlines() if ln.startswith("qvl: error")][0]
    assert entry in line and "outside the artifact" in line, line
    assert all(Path(p).resolve().is_relative_to(out.resolve()) for p in opened), opened


def test_graph_names_in_rbln_config_cannot_point_outside(tmp_path, monkeypatch, capsys):
    from tests.fakes_rbln import make_rebel, rbln_config_json, write_artifact

    plan = build_plan("rebel100-1npu")
    cfg = rbln_config_json(plan)
    out = write_artifact(tmp_path / "art", plan, cfg=cfg)
    cfg["_compile_cfgs"][0]["compiled_model_name"] = "../../outside"
    (out / "rbln_config.json").write_text(json.dumps(cfg))
    (tmp_path / "outside.rbln").write_text(json.dumps({"graph": "x", "alloc": {}}))
    rebel = make_rebel()
    read: list[str] = []
    real_cls = rebel.RBLNCompiledModel

    class Recording(real_cls):
        def __init__(self, path):
            read.append(str(path))
            super().__init__(path)

    rebel.RBLNCompiledModel = Recording
    install(monkeypatch, None, rebel=rebel, with_optimum=False)
    code, _, err = run_main(["load-check", str(out), "--no-runtime"], capsys)
    assert code == 2 and "../../outside" in err and "outside the artifact" in err, err
    assert all(Path(p).resolve().is_relative_to(out.resolve()) for p in read), read


def test_request_files_with_outside_paths_write_nothing(tmp_path, capsys):
    """infer only reads: a batch file naming ../.. and absolute paths gets a clear error and nothing is written."""
    model = write_hf_model(tmp_path / "tiny", TINY_CONFIG)
    art = tmp_path / "art"
    code, _, err = run_main(
        ["compile", "--preset", "cpu-tiny", "--model", str(model), "-o", str(art), "--no-cache"], capsys
    )
    assert code == 0, err
    reqs = tmp_path / "reqs" / "r.jsonl"
    reqs.parent.mkdir()
    reqs.write_text(
        json.dumps({"prompt": "x", "images": ["../../../../nope-outside.png"]})
        + "\n"
        + json.dumps({"prompt": "y", "image": "/nonexistent-qvl/abs.png"})
        + "\n"
    )
    before = _snapshot(tmp_path, Path(os.environ["QVL_HOME"]))
    code, stdout, err = run_main(["infer", str(art), "--batch-file", str(reqs)], capsys)
    assert code == 2, err
    lines = [ln.strip() for ln in err.splitlines()]  # both bad lines are reported, one line each
    assert any("nope-outside.png" in ln and "r.jsonl:1" in ln for ln in lines), err
    assert any("abs.png" in ln and "r.jsonl:2" in ln for ln in lines), err
    assert _snapshot(tmp_path, Path(os.environ["QVL_HOME"])) == before


def test_a_preset_output_dir_through_a_symlink_cannot_leave_the_working_directory(tmp_path, monkeypatch):
    outside = tmp_path / "outside"
    outside.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    (work / "link").symlink_to(outside)
    (work / "qvl-out").mkdir()
    preset = work / "p.yaml"
    preset.write_text("extends: cpu-tiny\noutput_dir: link/x\n")
    monkeypatch.chdir(work)
    with pytest.raises(InputError) as info:
        build_plan(str(preset))
    assert "outside the working directory" in info.value.one_line()
    preset.write_text("extends: cpu-tiny\noutput_dir: qvl-out/x\n")  # a real directory below: fine
    assert build_plan(str(preset)).output_dir == "qvl-out/x"
