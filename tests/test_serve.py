"""`qvl serve` / `qvl bench-serve`: preflight, the vllm-rbln command as data, exec, and the ViT packing plugin.

Artifacts are built in the real optimum-rbln 0.12 layout by tests/fakes_rbln.py; a stand-in `vllm` executable
(tests/stand_in_vllm.py) first on PATH records the argv and environment it was started with. vLLM itself is never
installed or imported.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import shlex
import subprocess
import sys
import tomllib
import types
from importlib import metadata
from pathlib import Path

import pytest

from qwenvl_rbln.artifacts.last_compile import record_last_compile
from qwenvl_rbln.artifacts.manifest import MANIFEST_NAME, TORCH_CONFIG_NAME, write_manifest
from qwenvl_rbln.planning.plan import build_plan
from qwenvl_rbln.serving.bench import bench_command
from qwenvl_rbln.serving.command import serve_command
from qwenvl_rbln.serving.flags import parse_count, parse_flags
from qwenvl_rbln.serving.options import PACKING_ENV, PLUGIN_GROUP, PLUGIN_NAME, BenchOptions, ServeOptions
from tests.fakes_rbln import rbln_config_json, run_main, write_artifact
from tests.helpers_cli import REPO, free_port, run_qvl
from tests.stand_in_vllm import RECORD_ENV, install_stand_in, read_record

# where optimum-rbln 0.12 defines RBLNQwen3VLVisionModel (the class the packed forward is installed on)
VISION_MODULE = "optimum.rbln.transformers.models.qwen3_vl.modeling_qwen3_vl"


@pytest.fixture(scope="module")
def plans():
    return {name: build_plan(name) for name in ("rebel100-1npu", "rebel100-1npu-vit-buckets", "rebel100-2npu-batch4")}


def make_artifact(path: Path, plan, *, manifest: bool = True, cfg: dict | None = None, **extra) -> Path:
    root = write_artifact(path, plan, cfg=cfg)
    if manifest:
        data = {
            "format": 1,
            "npu": plan.npu,
            "placement": plan.placement,
            "model": {"id": "Qwen/Qwen3-VL-2B-Instruct"},
            **extra,
        }
        write_manifest(root, data)
    return root


@pytest.fixture
def art(tmp_path, plans):
    return make_artifact(tmp_path / "art", plans["rebel100-1npu"])


@pytest.fixture
def no_exec(monkeypatch):
    """In-process runs must never exec: a refusal that failed to refuse would replace the test process."""

    def boom(*args, **kwargs):
        raise AssertionError(f"exec was attempted: {args[:2]}")

    monkeypatch.setattr(os, "execvpe", boom)


@pytest.fixture
def stand_in(tmp_path):
    """PATH with the stand-in vllm first, and where it records its run."""
    bin_dir = tmp_path / "bin"
    install_stand_in(bin_dir)
    record = tmp_path / "record.json"
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", RECORD_ENV: str(record)}
    return types.SimpleNamespace(env=env, record=record)


def with_flags(argv: list[str], *flags: str) -> list[str]:
    """qvl's own flags go before `--` (everything after it belongs to vllm)."""
    cut = argv.index("--") if "--" in argv else len(argv)
    return [*argv[:cut], *flags, *argv[cut:]]


def dry(argv: list[str], capsys) -> dict:
    code, out, err = run_main(with_flags(argv, "--dry-run", "--json"), capsys)
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == {"argv", "env", "checks"}
    return data


def refused(argv: list[str], capsys, code: int = 2) -> str:
    got, out, err = run_main(argv, capsys)
    assert got == code, (got, out, err)
    lines = [line for line in err.strip().splitlines() if not line.startswith(("warning:", "qvl: exec "))]
    assert len(lines) == 1 and lines[0].startswith("qvl: error:"), err
    assert "fix:" in lines[0] and "Traceback" not in err
    return lines[0]


def flag_value(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


ENGINES = ["0.11.1a1", "0.12.0"]  # one vllm-rbln of each generation (serving/engine.py)


def placement_of(data: dict) -> tuple[str, dict]:
    """(the visible NPUs, the placement vllm-rbln reads) from either generation's line, checking it is one line."""
    argv, env = data["argv"], data["env"]
    if "--rbln-optimum-overrides" in argv:
        assert "--additional-config" not in argv and env.get("RBLN_DEVICES") is None  # unset (N5)
        return env["RBLN_VISIBLE_DEVICES"], json.loads(flag_value(argv, "--rbln-optimum-overrides"))
    assert env.get("RBLN_VISIBLE_DEVICES") is None  # unset (N5)
    config = json.loads(flag_value(argv, "--additional-config"))
    assert set(config) == {"rbln_config"}
    return env["RBLN_DEVICES"], config["rbln_config"]


# ------------------------------------------------------------------------------------ the command itself


def test_serve_dry_run_builds_the_command_from_the_artifact(art, capsys, no_exec):
    data = dry(["serve", str(art)], capsys)
    argv = data["argv"]
    assert argv[:3] == ["vllm", "serve", str(art.absolute())]
    assert flag_value(argv, "--max-model-len") == "262144"
    assert flag_value(argv, "--max-num-seqs") == "1"
    # the fake's processor files carry no sizes: images are capped per request (images_kwargs: transformers 5
    # ignores max_pixels alone at call time), video frames through the plugin
    cap = {"shortest_edge": 65536, "longest_edge": 16384 * 16 * 16}
    assert json.loads(flag_value(argv, "--mm-processor-kwargs")) == {
        "max_pixels": 16384 * 256,
        "images_kwargs": {"size": cap},
    }
    assert data["env"]["QVL_MAX_FRAME_PIXELS"] == str(16384 * 256)
    limits = json.loads(flag_value(argv, "--limit-mm-per-prompt"))
    # the reserve for template, text and output is left free: (262144 - 128) // (4096 pads + start/end)
    assert limits["image"] == (262144 - 128) // (16384 // 4 + 2) == 63 and limits["video"] >= 1
    # the default line is vllm-rbln 0.11's (installed here, and qvl's default where none is)
    assert json.loads(flag_value(argv, "--additional-config")) == {
        "rbln_config": {"device": 0, "visual": {"device": 0}}
    }
    assert "--rbln-optimum-overrides" not in argv
    assert flag_value(argv, "--host") == "127.0.0.1" and flag_value(argv, "--port") == "8000"
    assert flag_value(argv, "--served-model-name") == "Qwen/Qwen3-VL-2B-Instruct"
    assert data["env"]["RBLN_DEVICES"] == "0" and data["env"]["RBLN_VISIBLE_DEVICES"] is None
    assert data["env"][PACKING_ENV] == "1"
    names = [c["check"] for c in data["checks"]]
    for name in ("rbln_config", "not emulated", "cls_name", "optimum_rbln_version", "graph files", "processor files"):
        assert name in names
    assert all(c["ok"] for c in data["checks"])


def test_human_dry_run_is_a_shell_script_of_the_same_command(art, capsys, no_exec):
    data = dry(["serve", str(art), "--", "--enforce-eager"], capsys)
    code, out, err = run_main(["serve", str(art), "--dry-run", "--", "--enforce-eager"], capsys)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert all(line.startswith("# ok ") for line in lines[: len(data["checks"])])
    assert "export RBLN_DEVICES=0" in lines and "export QVL_VIT_PACKING=1" in lines
    assert shlex.split(lines[-1]) == data["argv"]


def test_serve_execs_exactly_what_dry_run_printed(tmp_path, plans, stand_in):
    root = make_artifact(tmp_path / "art2", plans["rebel100-2npu-batch4"])
    env = {**stand_in.env, "RBLN_VISIBLE_DEVICES": "7", "VLLM_PLUGINS": "rbln"}
    args = ["serve", str(root), "--port", str(free_port()), "--", "--enforce-eager", "--max-model-len=262144"]
    shown = run_qvl(*with_flags(args, "--dry-run", "--json"), env=env)
    assert shown.exit_code == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert not stand_in.record.exists()  # --dry-run starts nothing
    assert data["env"]["RBLN_VISIBLE_DEVICES"] is None  # the other generation's name is unset, never left to pick
    assert data["env"]["VLLM_PLUGINS"] == f"rbln,{PLUGIN_NAME}"  # an allowlist gets the plugin added
    ran = run_qvl(*args, env=env)
    assert ran.exit_code == 0, ran.stderr
    rec = read_record(stand_in.record)
    assert Path(rec["argv"][0]).name == "vllm" and rec["argv"][1:] == data["argv"][1:]
    for key, value in data["env"].items():
        assert rec["env"].get(key) == value, key
    assert rec["argv"][-2:] == ["--enforce-eager", "--max-model-len=262144"]
    assert placement_of(rec) == ("0,1", {"device": 0, "visual": {"device": 1}})


def test_default_dir_is_the_last_compile_as_for_infer(art, capsys, monkeypatch, tmp_path, no_exec):
    monkeypatch.setenv("QVL_HOME", str(tmp_path / "home"))
    record_last_compile(art, "rebel100-1npu")
    assert dry(["serve"], capsys)["argv"][2] == str(art.absolute())
    assert dry(["serve", "--", "--enforce-eager"], capsys)["argv"][-1] == "--enforce-eager"
    assert flag_value(dry(["bench-serve"], capsys)["argv"], "--tokenizer") == str(art.absolute())
    monkeypatch.setenv("QVL_HOME", str(tmp_path / "empty-home"))
    monkeypatch.chdir(tmp_path)  # the preset's relative output_dir does not exist here
    line = refused(["serve", "--preset", "rebel100-1npu"], capsys)
    assert "no artifacts at" in line and "`qvl compile --preset rebel100-1npu`" in line
    assert "`qvl serve DIR" in line and "qvl infer" not in line


# ------------------------------------------------------------------------------------------- preflight


def _drop(*names):
    def edit(root: Path, cfg: dict) -> None:
        for name in names:
            (root / name).unlink()

    return edit


def _cfg(**changes):
    def edit(root: Path, cfg: dict) -> None:
        for key, value in changes.items():
            if value is _DELETE:
                cfg.pop(key, None)
            else:
                cfg[key] = value
        (root / "rbln_config.json").write_text(json.dumps(cfg))

    return edit


_DELETE = object()


def _no_block(root: Path, cfg: dict) -> None:
    _cfg(kvcache_block_size=_DELETE, kvcache_partition_len=_DELETE)(root, cfg)


def _no_chat_template(root: Path, cfg: dict) -> None:
    (root / "chat_template.jinja").unlink()


def _bad_json(root: Path, cfg: dict) -> None:
    (root / "rbln_config.json").write_text("{not json")


def _torch_artifact(root: Path, cfg: dict) -> None:
    (root / "rbln_config.json").rename(root / TORCH_CONFIG_NAME)


PREFLIGHT = {
    "rbln_config.json missing": (_drop("rbln_config.json"), "no rbln_config.json"),
    "rbln_config.json not JSON": (_bad_json, "not valid JSON"),
    "torch reference artifact": (_torch_artifact, "torch reference artifact"),
    "foreign cls_name": (_cfg(cls_name="RBLNLlamaForCausalLMConfig"), "cls_name='RBLNLlamaForCausalLMConfig'"),
    "older optimum-rbln": (_cfg(optimum_rbln_version="0.11.1"), "optimum_rbln_version='0.11.1'"),
    "newer optimum-rbln": (_cfg(optimum_rbln_version="0.13.0"), "optimum_rbln_version='0.13.0'"),
    "no batch_size": (_cfg(batch_size=_DELETE), "batch_size"),
    "no max_seq_len": (_cfg(max_seq_len=_DELETE), "max_seq_len"),
    "no kvcache_num_blocks": (_cfg(kvcache_num_blocks=_DELETE), "kvcache_num_blocks"),
    "kvcache_num_blocks 0": (_cfg(kvcache_num_blocks=0), "kvcache_num_blocks=0"),
    "no prefill_chunk_size": (_cfg(prefill_chunk_size=_DELETE), "prefill_chunk_size"),
    "no block size": (_no_block, "kvcache_block_size or kvcache_partition_len"),
    "partition != block": (_cfg(kvcache_partition_len=16384), "kvcache_partition_len=16384 differs"),
    "no prefill graph": (_drop("prefill.rbln"), "missing prefill.rbln"),
    "no decoder graph": (_drop("decoder_batch_1.rbln"), "missing decoder_batch_1.rbln"),
    "no ViT graph": (_drop("visual/compiled_model.rbln"), "missing visual/compiled_model.rbln"),
    "no processor config": (_drop("processor_config.json"), "no processor config file"),
    "no tokenizer": (_drop("tokenizer.json"), "no tokenizer file"),
    "no chat template": (_no_chat_template, "no chat template"),
}


@pytest.mark.parametrize("case", sorted(PREFLIGHT))
def test_every_preflight_refusal_is_one_line_and_starts_nothing(case, tmp_path, plans, capsys, no_exec, stand_in):
    edit, needle = PREFLIGHT[case]
    plan = plans["rebel100-1npu"]
    root = make_artifact(tmp_path / "art", plan, manifest=False)
    edit(root, rbln_config_json(plan))
    for command in ("serve", "bench-serve"):
        line = refused([command, str(root)], capsys)
        assert needle in line, line
        line = refused(with_flags([command, str(root)], "--dry-run", "--json"), capsys)
        assert needle in line, line
    assert not stand_in.record.exists()


def test_missing_directory_is_refused(tmp_path, capsys, no_exec):
    assert "does not exist" in refused(["serve", str(tmp_path / "nope")], capsys)


def test_edited_file_against_the_manifest_is_refused(art, capsys, no_exec):
    (art / "prefill.rbln").write_text('{"graph": "tampered"}')
    line = refused(["serve", str(art)], capsys)
    assert "prefill.rbln" in line and "sha256" in line
    # bench-serve does not re-hash gigabytes: the server it talks to was checked when it started
    assert dry(["bench-serve", str(art)], capsys)["argv"][:3] == ["vllm", "bench", "serve"]


def test_emulated_artifact_is_refused(tmp_path, plans, capsys, no_exec):
    root = make_artifact(tmp_path / "emu", plans["rebel100-1npu"], emulated=True)
    line = refused(["serve", str(root), "--dry-run"], capsys)
    assert "emulated: true" in line and "RBLN host" in line
    assert "emulated" in refused(["bench-serve", str(root)], capsys)


def test_emulated_graph_without_a_manifest_is_refused(tmp_path, plans, capsys, no_exec):
    from qwenvl_rbln.artifacts.emulated import FORMAT

    root = make_artifact(tmp_path / "emu", plans["rebel100-1npu"], manifest=False)
    header = json.dumps({"__metadata__": {"format": FORMAT, "emulated": "true"}}).encode()
    (root / "prefill.rbln").write_bytes(len(header).to_bytes(8, "little") + header)
    line = refused(["serve", str(root), "--dry-run"], capsys)
    assert "prefill.rbln was written by qvl's CPU emulator" in line


def test_chat_template_inside_tokenizer_config_is_enough(tmp_path, plans, capsys, no_exec):
    root = make_artifact(tmp_path / "art", plans["rebel100-1npu"], manifest=False)
    (root / "chat_template.jinja").unlink()
    (root / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    checks = {c["check"]: c["detail"] for c in dry(["serve", str(root)], capsys)["checks"]}
    assert "tokenizer_config.json" in checks["processor files"]


def test_no_manifest_still_serves_and_says_hashes_cannot_be_checked(tmp_path, plans, capsys, no_exec):
    root = make_artifact(tmp_path / "art", plans["rebel100-1npu"], manifest=False)
    data = dry(["serve", str(root)], capsys)
    checks = {c["check"]: c["detail"] for c in data["checks"]}
    assert "cannot be detected" in checks["manifest hashes"]
    assert flag_value(data["argv"], "--served-model-name") == "art"


# ------------------------------------------------------------------------------------ pass-through flags

CONFLICTS = [
    (["--tensor-parallel-size", "2"], "tensor parallelism"),
    (["--tensor-parallel-size=2"], "tensor parallelism"),
    (["-tp", "4"], "tensor parallelism"),
    (["--max-num-batched-tokens", "8192"], "prefill_chunk_size is 512"),
    (["--max-num-batched-tokens=8192"], "prefill_chunk_size is 512"),
    (["--max-model-len", "32768"], "max_seq_len is 262144"),
    (["--max-model-len=32k"], "max_seq_len is 262144"),
    (["--max_model_len", "1000"], "max_seq_len is 262144"),
    (["--max-model-len"], "max_seq_len is 262144"),
    (["--max-num-seqs", "4"], "batch_size is 1"),
    (["--max-num-seqs=4"], "batch_size is 1"),
    (["--block-size", "16"], "kvcache_block_size is 8192"),
    (["--pipeline-parallel-size=2"], "pipeline"),
    (["--speculative-config", '{"method": "ngram"}'], "speculative"),
    (["--host", "0.0.0.0"], "qvl serve --host"),
    (["--port=9000"], "qvl serve --port"),
    (["--served-model-name", "x"], "qvl serve --served-model-name"),
    (["--rbln-optimum-overrides", '{"device": 3}'], "--device / --visual-device"),
    (["--additional-config", '{"rbln_config": {"device": 3}}'], "--device / --visual-device"),
    (["--mm-processor-kwargs", '{"max_pixels": 99999999}'], "largest compiled ViT bucket"),
    (["--mm-processor-kwargs.max_pixels", "99999999"], "largest compiled ViT bucket"),
    (["--mm-processor-kwargs=not-json"], "not a JSON object"),
]


@pytest.mark.parametrize(("extra", "needle"), CONFLICTS, ids=[" ".join(c[0]) for c in CONFLICTS])
def test_every_conflicting_pass_through_is_refused(extra, needle, art, capsys, no_exec, stand_in):
    line = refused(["serve", str(art), "--", *extra], capsys)
    head = extra[0].split("=")[0].split(".")[0].replace("_", "-")
    assert needle in line and head in line, line
    refused(with_flags(["serve", str(art), "--", *extra], "--dry-run"), capsys)
    assert not stand_in.record.exists()


AGREEING = [
    ["--max-model-len", "262144"],
    ["--max-model-len=256K"],
    ["--tensor-parallel-size=1"],
    ["-tp", "1"],
    ["--max-num-batched-tokens", "512"],
    ["--max-num-seqs=1"],
    ["--block-size", "8192"],
    ["--enforce-eager", "--allowed-local-media-path", "/data"],
]


@pytest.mark.parametrize("extra", AGREEING, ids=[" ".join(a) for a in AGREEING])
def test_pass_through_that_agrees_with_the_artifact_goes_to_vllm_unchanged(extra, art, capsys, no_exec):
    argv = dry(["serve", str(art), "--", *extra], capsys)["argv"]
    assert argv[-len(extra) :] == extra


def test_users_processor_kwargs_and_limits_replace_qvls(art, capsys, no_exec):
    argv = dry(
        [
            "serve",
            str(art),
            "--",
            "--mm-processor-kwargs",
            '{"min_pixels": 65536, "max_pixels": 802816}',
            '--limit-mm-per-prompt={"image": 2}',
        ],
        capsys,
    )["argv"]
    assert argv.count("--mm-processor-kwargs") == 1 and flag_value(argv, "--mm-processor-kwargs").endswith("802816}")
    assert "--limit-mm-per-prompt" not in argv and argv[-1] == '--limit-mm-per-prompt={"image": 2}'


def test_parse_flags_reads_both_spellings():
    got = parse_flags(["--a", "1", "--b=2", "--c", "--d", "-5", "x", "-tp", "2"])
    assert [(f, v) for f, v, _, _ in got] == [("--a", "1"), ("--b", "2"), ("--c", None), ("--d", "-5"), ("-tp", "2")]
    assert parse_count("32k") == 32000 and parse_count("32K") == 32768
    assert parse_count("1.5k") == 1500 and parse_count("auto") is None


# -------------------------------------------------------------------------------------------- placement


@pytest.mark.parametrize(
    ("flags", "visible", "overrides"),
    [
        ([], "0,1", {"device": 0, "visual": {"device": 1}}),
        (["--device", "2", "--visual-device", "3"], "2,3", {"device": 0, "visual": {"device": 1}}),
        (["--device", "5", "--visual-device", "1"], "1,5", {"device": 1, "visual": {"device": 0}}),
        (["--device", "2"], "1,2", {"device": 1, "visual": {"device": 0}}),  # the ViT keeps its own NPU
        # both on one NPU does not fit this artifact: tests/test_serve_memory.py
    ],
)
@pytest.mark.parametrize("engine", ENGINES)
def test_placement_flags_set_visible_devices_and_overrides(
    engine, flags, visible, overrides, tmp_path, plans, capsys, no_exec
):
    root = make_artifact(tmp_path / "art", plans["rebel100-2npu-batch4"])
    data = dry(["serve", str(root), *flags, "--vllm-rbln", engine], capsys)
    assert placement_of(data) == (visible, overrides)  # the same ids, in the generation's own flag and variable
    assert flag_value(data["argv"], "--max-num-seqs") == "4"


@pytest.mark.parametrize("engine", ENGINES)
def test_device_alone_moves_both_when_they_were_compiled_together(engine, art, capsys, no_exec):
    data = dry(["serve", str(art), "--device", "3", "--vllm-rbln", engine], capsys)
    assert placement_of(data) == ("3", {"device": 0, "visual": {"device": 0}})


@pytest.mark.parametrize(
    ("engine", "name", "other"),
    [("0.11.1a1", "RBLN_DEVICES", "RBLN_VISIBLE_DEVICES"), ("0.12.0", "RBLN_VISIBLE_DEVICES", "RBLN_DEVICES")],
)
def test_inherited_visible_devices_are_replaced_and_said_so(engine, name, other, art, capsys, monkeypatch, no_exec):
    monkeypatch.setenv(name, "4,5")
    monkeypatch.setenv(other, "6")
    data = dry(["serve", str(art), "--device", "1", "--vllm-rbln", engine], capsys)
    assert data["env"][name] == "1" and data["env"][other] is None  # the other name can never pick other NPUs
    assert any("replaces the inherited 4,5" in c["detail"] for c in data["checks"])


def test_a_damaged_recorded_placement_is_one_line(tmp_path, plans, capsys, no_exec):
    root = make_artifact(tmp_path / "art", plans["rebel100-1npu"])
    manifest = json.loads((root / MANIFEST_NAME).read_text())
    manifest["placement"] = {"device": "zero", "visual_device": 0}
    (root / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert "'zero'" in refused(["serve", str(root)], capsys)
    assert placement_of(dry(["serve", str(root), "--device", "0"], capsys))[0] == "0"


def test_no_manifest_places_both_on_device_0(tmp_path, plans, capsys, no_exec):
    root = make_artifact(tmp_path / "art", plans["rebel100-2npu-batch4"], manifest=False)
    data = dry(["serve", str(root)], capsys)
    assert placement_of(data)[0] == "0"


@pytest.mark.parametrize(
    ("flags", "needle"),
    [(["--device", "0,1"], "num_devices=1"), (["--device", "x"], "not an NPU id"), (["--visual-device", "-1"], "-1")],
)
def test_bad_placement_is_refused(flags, needle, art, capsys, no_exec):
    assert needle in refused(["serve", str(art), *flags], capsys)


# -------------------------------------------------------------------------------------------- bench-serve


def test_bench_serve_argv(tmp_path, plans, capsys, no_exec):
    from qwenvl_rbln.vision.buckets import select_bucket
    from qwenvl_rbln.vision.geometry import image_geometry

    plan = plans["rebel100-1npu-vit-buckets"]
    root = make_artifact(tmp_path / "art", plan)
    data = dry(["bench-serve", str(root), "--port", "8123", "--num-prompts", "7", "--", "--request-rate", "2"], capsys)
    argv = data["argv"]
    assert argv[:3] == ["vllm", "bench", "serve"]
    assert flag_value(argv, "--backend") == "openai-chat"
    assert flag_value(argv, "--endpoint") == "/v1/chat/completions"
    assert flag_value(argv, "--dataset-name") == "random-mm"
    assert flag_value(argv, "--max-concurrency") == str(plan.resolved.batch_size)
    assert flag_value(argv, "--port") == "8123" and flag_value(argv, "--num-prompts") == "7"
    assert flag_value(argv, "--tokenizer") == str(root.absolute())
    serve_argv = dry(["serve", str(root)], capsys)["argv"]
    assert flag_value(argv, "--model") == flag_value(serve_argv, "--served-model-name")
    assert json.loads(flag_value(argv, "--random-mm-limit-mm-per-prompt")) == {"image": 1, "video": 0}
    buckets = ast.literal_eval(flag_value(argv, "--random-mm-bucket-config"))
    max_pixels = json.loads(flag_value(serve_argv, "--mm-processor-kwargs"))["max_pixels"]
    landed = set()
    for (height, width, frames), share in buckets.items():
        assert frames == 1 and share > 0
        geo = image_geometry(width, height, max_pixels=max_pixels)
        landed.add(select_bucket(geo.patches, plan.vit_buckets))
    assert landed == set(plan.vit_buckets)  # one image size per compiled bucket, each landing in it
    assert argv[-2:] == ["--request-rate", "2"]
    assert data["env"] == {}


def test_bench_serve_concurrency_is_the_compiled_batch(tmp_path, plans, capsys, no_exec):
    root = make_artifact(tmp_path / "art", plans["rebel100-2npu-batch4"])
    assert flag_value(dry(["bench-serve", str(root)], capsys)["argv"], "--max-concurrency") == "4"
    assert "qvl sets it" in refused(["bench-serve", str(root), "--", "--max-concurrency=8"], capsys)
    assert "--input-len" in refused(["bench-serve", str(root), "--", "--random-input-len", "9"], capsys)
    assert "compiled ViT buckets" in refused(["bench-serve", str(root), "--", "--random-mm-bucket-config={}"], capsys)


def test_bench_serve_refuses_text_that_leaves_no_room_for_an_image(art, capsys, no_exec):
    line = refused(["bench-serve", str(art), "--input-len", "300000"], capsys)
    assert "--input-len 300000" in line and "max_seq_len 262144" in line


def test_bench_serve_execs_the_stand_in(art, stand_in):
    shown = run_qvl("bench-serve", str(art), "--dry-run", "--json", env=stand_in.env)
    ran = run_qvl("bench-serve", str(art), env=stand_in.env)
    assert ran.exit_code == 0, ran.stderr
    assert read_record(stand_in.record)["argv"][1:] == json.loads(shown.stdout)["argv"][1:]


# ---------------------------------------------------------------------------------------------- no vllm


@pytest.mark.parametrize("command", ["serve", "bench-serve"])
def test_no_vllm_on_path_is_exit_3_in_one_line(command, art, capsys, monkeypatch, tmp_path, no_exec):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    line = refused([command, str(art)], capsys, code=3)
    assert "`vllm` is not on PATH" in line and "install vllm-rbln" in line
    assert dry([command, str(art)], capsys)["argv"][0] == "vllm"  # --dry-run needs no vllm


def test_no_vllm_import_anywhere(art):
    for path in sorted((REPO / "qwenvl_rbln").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n == "vllm" or n.startswith("vllm.") for n in names), path
    code = (
        "import sys\n"
        f"sys.argv = ['qvl', 'serve', {str(art)!r}, '--dry-run', '--json']\n"
        "from qwenvl_rbln import cli\n"
        "try:\n    cli.main()\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
        "heavy = {'vllm', 'torch', 'transformers', 'optimum'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy), file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "[]"


# ------------------------------------------------------------------------------------- ViT packing plugin


def test_plugin_entry_point_is_declared_and_installed():
    data = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    group = data["project"]["entry-points"][PLUGIN_GROUP]
    assert group == {PLUGIN_NAME: "qwenvl_rbln.vllm_plugin:register"}
    found = [ep for ep in metadata.entry_points(group=PLUGIN_GROUP) if ep.name == PLUGIN_NAME]
    assert len(found) == 1, "reinstall qvl (`make install`) so the installed metadata carries the entry point"
    from qwenvl_rbln import vllm_plugin

    assert found[0].load() is vllm_plugin.register


@pytest.fixture
def plugin(monkeypatch):
    from qwenvl_rbln import vllm_plugin

    monkeypatch.setattr(vllm_plugin, "_installed", False)
    return vllm_plugin


@pytest.fixture
def fake_optimum(monkeypatch):
    """optimum.rbln with a RBLNQwen3VLVisionModel whose forward a packing install replaces."""

    class RBLNQwen3VLVisionModel:
        def forward(self, hidden_states, grid_thw=None):
            return "unpacked"

    parts = VISION_MODULE.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        mod = types.ModuleType(name)
        mod.__path__ = []  # a package, so the next level imports
        monkeypatch.setitem(sys.modules, name, mod)
    mod.RBLNQwen3VLVisionModel = RBLNQwen3VLVisionModel
    return RBLNQwen3VLVisionModel


@pytest.fixture
def packing_module(monkeypatch, fake_optimum):
    """A qwenvl_rbln.backends.vit_packing with the agreed contract: install_on_class() patches the class."""
    calls = []

    def install_on_class():
        import importlib

        calls.append(1)
        importlib.import_module(VISION_MODULE).RBLNQwen3VLVisionModel.forward = (
            lambda self, hidden_states, grid_thw=None: "packed"
        )

    mod = types.ModuleType("qwenvl_rbln.backends.vit_packing")
    mod.install_on_class = install_on_class
    monkeypatch.setitem(sys.modules, "qwenvl_rbln.backends.vit_packing", mod)
    return calls


def test_plugin_does_nothing_unless_serve_enabled_packing(plugin, packing_module, fake_optimum, monkeypatch, capsys):
    monkeypatch.delenv(PACKING_ENV, raising=False)
    plugin.register()
    monkeypatch.setenv(PACKING_ENV, "0")
    plugin.register()
    assert packing_module == [] and fake_optimum().forward(None) == "unpacked"
    assert capsys.readouterr().err == ""


def test_plugin_installs_the_packed_forward_once(plugin, packing_module, fake_optimum, monkeypatch, capsys):
    monkeypatch.setenv(PACKING_ENV, "1")
    plugin.register()
    plugin.register()  # vLLM may load plugins more than once per process
    assert packing_module == [1]
    assert fake_optimum().forward(None) == "packed"  # every instance, including ones built later
    assert capsys.readouterr().err == ""


def test_plugin_without_packing_module_warns_in_one_line(plugin, monkeypatch, capsys):
    monkeypatch.setenv(PACKING_ENV, "1")
    monkeypatch.setitem(sys.modules, "qwenvl_rbln.backends.vit_packing", None)
    plugin.register()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("qvl: warning:") and "unpacked" in err[0]


def test_plugin_without_optimum_warns_in_one_line(plugin, monkeypatch, capsys):
    monkeypatch.setenv(PACKING_ENV, "1")
    mod = types.ModuleType("qwenvl_rbln.backends.vit_packing")

    def install_on_class():
        raise ModuleNotFoundError("No module named 'optimum.rbln'")

    mod.install_on_class = install_on_class
    monkeypatch.setitem(sys.modules, "qwenvl_rbln.backends.vit_packing", mod)
    plugin.register()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "optimum-rbln is not importable" in err[0]


def test_real_packing_module_patches_the_optimum_class(plugin, fake_optimum, monkeypatch):
    """With issue 11's packed forward present: register() reaches optimum-rbln's class through it."""
    vit_packing = pytest.importorskip("qwenvl_rbln.backends.vit_packing")
    monkeypatch.setenv(PACKING_ENV, "1")
    before = fake_optimum.forward
    try:
        plugin.register()
        assert fake_optimum.forward is vit_packing.packed_forward
        assert fake_optimum().forward.__func__ is vit_packing.packed_forward  # every instance
    finally:
        vit_packing.uninstall_class(fake_optimum)
    assert fake_optimum.forward is before


def test_serve_packing_switches(art, tmp_path, capsys, monkeypatch, no_exec):
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    on = dry(["serve", str(art)], capsys)
    assert on["env"][PACKING_ENV] == "1" and "VLLM_PLUGINS" not in on["env"]
    off = dry(["serve", str(art), "--no-vit-packing"], capsys)
    assert off["env"][PACKING_ENV] == "0"
    assert any(c["check"] == "vit packing" and c["detail"].startswith("off") for c in off["checks"])
    preset = tmp_path / "no-packing.yaml"
    preset.write_text("extends: rebel100-1npu\nruntime:\n  vit_packing: false\n")
    assert dry(["serve", str(art), "--preset", str(preset)], capsys)["env"][PACKING_ENV] == "0"
    assert dry(["serve", str(art), "--preset", str(preset), "--vit-packing"], capsys)["env"][PACKING_ENV] == "1"
    monkeypatch.setenv("VLLM_PLUGINS", f"rbln,{PLUGIN_NAME}")
    assert "VLLM_PLUGINS" not in dry(["serve", str(art)], capsys)["env"]  # already allowed: left alone


def test_a_vllm_that_cannot_start_is_one_line(art, capsys, monkeypatch, stand_in):
    def broken(*args, **kwargs):
        raise OSError(8, "Exec format error")

    monkeypatch.setattr(os, "execvpe", broken)
    monkeypatch.setenv("PATH", stand_in.env["PATH"])
    line = refused(["serve", str(art)], capsys, code=3)
    assert "could not be started" in line and "Exec format error" in line


def test_a_real_emulated_compile_is_refused_with_or_without_its_manifest(tmp_path, capsys, no_exec):
    """`qvl compile --emulate` output (the emulator's real graph files and manifest), not a hand-made marker."""
    pytest.importorskip("torch")
    out = tmp_path / "tiny-rbln"
    env = {"QVL_EMULATE_NPU": "1", "OMP_NUM_THREADS": "1"}  # one intra-op thread: far faster on a busy 2-core box
    r = run_qvl("compile", "--preset", "cpu-tiny-rbln", "-o", str(out), env=env, timeout=600)
    assert r.exit_code == 0, r.stderr[-2000:]
    assert "emulated: true" in refused(["serve", str(out), "--dry-run"], capsys)
    (out / MANIFEST_NAME).unlink()
    assert "written by qvl's CPU emulator" in refused(["serve", str(out), "--dry-run"], capsys)


HOSTILE = [None, -1, 1.5, "x", [], {}, [1, "a"], True, 10**30, [{}]]


def test_hostile_rbln_config_values_are_input_errors_never_tracebacks(tmp_path, plans):
    from qwenvl_rbln.errors import QvlError

    plan = plans["rebel100-1npu"]
    root = make_artifact(tmp_path / "art", plan, manifest=False)
    base = rbln_config_json(plan)
    keys = [*base, "visual.max_seq_len", "visual._compile_cfgs", "visual.cls_name"]
    for key in keys:
        for value in HOSTILE:
            cfg = json.loads(json.dumps(base))
            section, _, name = key.rpartition(".")
            (cfg[section] if section else cfg)[name] = value
            (root / "rbln_config.json").write_text(json.dumps(cfg))
            for build in (
                lambda: serve_command(ServeOptions(directory=root), {}),
                lambda: bench_command(BenchOptions(directory=root)),
            ):
                with contextlib.suppress(QvlError):  # anything else (TypeError, KeyError...) fails the test
                    build()


def test_limit_mm_per_prompt_comes_from_the_presets_runtime_section(art, tmp_path, capsys, no_exec):
    preset = tmp_path / "limits.yaml"
    preset.write_text("extends: rebel100-1npu\nruntime:\n  limit_mm_per_prompt: {image: 4, video: 1}\n")
    argv = dry(["serve", str(art), "--preset", str(preset)], capsys)["argv"]
    assert json.loads(flag_value(argv, "--limit-mm-per-prompt")) == {"image": 4, "video": 1}


@pytest.mark.parametrize(
    ("value", "named"),
    [("{image: -1}", "limit_mm_per_prompt.image"), ("{audio: 1}", "audio"), ("3", "limit_mm_per_prompt")],
)
def test_a_bad_limit_mm_per_prompt_in_the_preset_is_one_line(art, tmp_path, capsys, no_exec, value, named):
    preset = tmp_path / "limits.yaml"
    preset.write_text(f"extends: rebel100-1npu\nruntime:\n  limit_mm_per_prompt: {value}\n")
    line = refused(["serve", str(art), "--preset", str(preset), "--dry-run"], capsys)
    assert named in line and "limits.yaml" in line, line


def test_an_artifact_without_a_preset_serves_the_limit_recorded_at_compile(art, tmp_path, capsys, no_exec):
    preset = tmp_path / "limits.yaml"
    preset.write_text("extends: rebel100-1npu\nruntime:\n  limit_mm_per_prompt: {image: 2}\n")
    from qwenvl_rbln.artifacts.manifest import manifest_for_plan, read_manifest, write_manifest
    from qwenvl_rbln.planning.plan import build_plan

    manifest = manifest_for_plan(build_plan(str(preset)), model={}, versions={}, cache_key=None)
    assert manifest["runtime"] == {"vit_packing": True, "limit_mm_per_prompt": {"image": 2}}
    on_disk = read_manifest(art)  # the fixture's own manifest, given the runtime section a compile records
    on_disk["runtime"] = manifest["runtime"]
    write_manifest(art, on_disk)
    argv = dry(["serve", str(art)], capsys)["argv"]
    assert json.loads(flag_value(argv, "--limit-mm-per-prompt")) == {"image": 2}
