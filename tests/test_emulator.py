"""Emulated Rebel100: optimum-rbln 0.12's real compile, load and generate on qvl's CPU emulator of rebel.

Each configuration is compiled once per module (tiny model, small buckets). What runs for real: optimum-rbln's
config resolution, wrapping, chunked prefill, page tables, decoder-batch graphs, ViT bucket loop, save/load,
and qvl's compile/load-check/infer glue. What is emulated: rebel (``qwenvl_rbln/emulator``).
"""

from __future__ import annotations

import json
import pickle
import shutil
import sys
import types
from importlib import util
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(util.find_spec("optimum.rbln") is None, reason="optimum-rbln is not installed")

from tests.emulated_rbln import emulated_model, generate_logits, image_prompt_inputs  # noqa: E402
from tests.fake_media import write_sweep_video  # noqa: E402
from tests.fakes_rbln import run_main  # noqa: E402

N = 5  # new tokens per request
BUCKETS = [256, 576, 1024]


@pytest.fixture(scope="module", autouse=True)
def emulator_scope():
    """The emulator is served as ``rebel`` only inside this module, with one torch thread (emulator_on says why);
    later modules see no rebel again, and KV sharing is back on whatever the negative control left."""
    from qwenvl_rbln.backends.emulator import rebel_api
    from tests.emulated_rbln import emulator_on

    with emulator_on():
        yield
    rebel_api.state.share_static_buffers = True


@pytest.fixture(scope="module")
def tiny() -> Path:
    from qwenvl_rbln.backends.tiny.model import ensure_tiny_model

    return ensure_tiny_model()


def _image(path: Path, size: int, seed: int) -> Path:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(path)
    return path


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("emu-media")
    out = {f"img{p}": _image(d / f"img{p}.png", s, p) for p, s in ((256, 256), (576, 384), (1024, 512))}
    video = write_sweep_video(d / "clip.mp4")  # 5 sampled frames -> 3 temporal patches (3 ViT graph calls)
    out["video"] = video
    out["dir"] = d
    return out


def _compile(out: Path, sets: list[str]) -> Path:
    from qwenvl_rbln.backends.rbln.optimum import use_emulator
    from qwenvl_rbln.jobs.compile_job import run_compile
    from qwenvl_rbln.memory.planner import estimate_plan
    from qwenvl_rbln.planning.plan import build_plan

    assert use_emulator(True)
    plan = build_plan("cpu-tiny-rbln", sets, output_dir=str(out))
    run_compile(plan, estimate_plan(plan), use_cache=False, heartbeat_s=0)
    return out


@pytest.fixture(scope="module")
def art(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cpu-tiny-rbln: flash attention (block 1024), batch 2 with decoder graphs [2, 1], three ViT buckets."""
    return _compile(tmp_path_factory.mktemp("emu") / "flash", [f"visual.max_seq_len={json.dumps(BUCKETS)}"])


@pytest.fixture(scope="module")
def art_eager(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    sets = [
        "attn_impl=eager",
        "kvcache_partition_len=null",
        "max_seq_len=2048",
        "batch_size=1",
        "decoder_batch_sizes=[1]",
        "visual.max_seq_len=[256]",
    ]
    return _compile(tmp_path_factory.mktemp("emu") / "eager", sets)


def _long_prompt() -> str:
    words = "Describe the scene in detail: a cat sitting on a red chair next to a window, 1 2 3 4 5 6 7 8 9 10. "
    return words * 45  # > 1024 tokens: the prefill's KV writes cross the 1024-token block boundary


def _requests(media: dict[str, Path]) -> list[dict[str, Any]]:
    return [
        {"id": "one-image", "prompt": "Describe this image.", "images": [str(media["img256"])]},
        {"id": "text", "prompt": "Say hello to the user.", "system": "Be brief."},
        {
            "id": "three-images",
            "prompt": "Compare the pictures.",
            "images": [str(media["img256"]), str(media["img576"]), str(media["img1024"])],
        },
        {"id": "video", "prompt": "What happens in the video?", "video": str(media["video"])},
        {"id": "two-images", "prompt": "What differs?", "images": [str(media["img576"]), str(media["img256"])]},
        {"id": "long", "prompt": _long_prompt()},
    ]


def _infer(capsys: Any, *args: str) -> tuple[int, dict | None, str]:
    code, out, err = run_main(["infer", *args, "--json"], capsys)
    return code, (json.loads(out) if out.strip() else None), err


# ---------------------------------------------------------------------------------------- compile, layout


def test_compile_layout_and_marks(art: Path):
    from qwenvl_rbln.artifacts.emulated import read_metadata
    from qwenvl_rbln.artifacts.layout import check_layout, read_artifact_config
    from qwenvl_rbln.artifacts.manifest import read_manifest

    manifest = read_manifest(art)
    assert manifest["emulated"] is True and "emulated by qvl" in manifest["versions"]["rebel-compiler"]
    kind, cfg = read_artifact_config(art)
    layout = check_layout(art, kind, cfg, manifest)
    assert layout["ok"], layout
    assert set(layout["graphs"]) == {"prefill", "decoder_batch_2", "decoder_batch_1", "visual/compiled_model"}
    for info in layout["graphs"].values():
        meta = read_metadata(art / info["file"])
        assert meta["emulated"] == "true" and "EMULATED" in meta["marker"]
    assert cfg["kvcache_num_blocks"] == 8  # sized automatically: 2 rows x 4096 / 1024
    assert sorted(cfg["visual"]["max_seq_len"]) == BUCKETS


def test_load_check_creates_runtimes_and_labels_sizes_emulated(art: Path, capsys):
    code, out, err = run_main(["load-check", str(art), "--emulate", "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["emulated"] is True and d["runtime"]["ok"] is True and "emulator" in d["runtime"]["note"]
    mem = d["memory"]
    assert mem["source"] == "emulated" and mem["estimate"]["source"] == "estimate"
    g = mem["graphs"]
    assert g["prefill"]["by_key"]["Weight"] > 0 and g["decoder_batch_2"]["kv_shared"] is True
    # the KV cache: 3 layers x (K, V) x 8 blocks x 2 heads x 1024 x 16 x fp32
    assert g["prefill"]["by_key"]["DramTensor"] == 6 * 8 * 2 * 1024 * 16 * 4
    code, out, _ = run_main(["load-check", str(art), "--emulate", "--calibrate"], capsys)
    assert code == 0 and "emulated: tensor sizes of the emulated graphs, not NPU figures" in out
    assert "emulated sizes are not NPU figures" in out  # never recorded as calibration
    assert "planner estimate" in out


def test_qvl_emulate_npu_turns_the_emulator_on_without_the_flag(art: Path, capsys, monkeypatch):
    from qwenvl_rbln.backends import emulator

    emulator.deactivate()
    monkeypatch.setenv("QVL_EMULATE_NPU", "1")
    code, out, err = run_main(["load-check", str(art), "--no-runtime", "--json"], capsys)
    assert code == 0 and json.loads(out)["emulated"] is True, err


# ----------------------------------------------------------------------------------- tokens vs reference


@pytest.fixture(scope="module")
def batch_file(media: dict[str, Path]) -> Path:
    path = media["dir"] / "requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _requests(media)))
    return path


def test_infer_tokens_equal_the_reference_backend(art, tiny, batch_file, capsys):
    code, emu, err = _infer(
        capsys, str(art), "--emulate", "--no-vit-packing", "--batch-file", str(batch_file), "--max-new-tokens", str(N)
    )
    assert code == 0, err
    code, ref, err = _infer(capsys, str(tiny), "--batch-file", str(batch_file), "--max-new-tokens", str(N))
    assert code == 0, err
    assert emu["backend"] == "rbln" and emu["emulated"] is True and ref["backend"] == "torch"
    got = {r["id"]: r["token_ids"] for r in emu["requests"]}
    want = {r["id"]: r["token_ids"] for r in ref["requests"]}
    assert got == want and all(len(t) == N for t in got.values())
    # batch 2 (decoder_batch_2) with left padding: each batch mixes prompt lengths
    assert [b["decoder_graph"] for b in emu["batches"]] == ["decoder_batch_2"] * 3
    assert len({r["prefill"]["tokens"] for r in emu["requests"][:2]}) == 2
    # three images and a 3-patch video in one batch: 6 compiled ViT graph calls, every bucket used
    b1 = emu["batches"][1]
    assert b1["request_ids"] == ["three-images", "video"] and b1["timings"]["vision_calls"] == 6
    used = {it["bucket"] for r in emu["requests"] for it in r["vision"]}
    assert used == set(BUCKETS)
    long = next(r for r in emu["requests"] if r["id"] == "long")
    assert long["prefill"]["tokens"] > 1024  # KV writes cross the first block


def test_eager_attention_tokens_equal_the_reference(art_eager, tiny, media, capsys):
    args = ["--image", str(media["img256"]), "--prompt", "Describe this image.", "--max-new-tokens", str(N)]
    code, emu, err = _infer(capsys, str(art_eager), "--emulate", *args)
    assert code == 0, err
    code, ref, err = _infer(capsys, str(tiny), *args)
    assert code == 0, err
    assert emu["requests"][0]["token_ids"] == ref["requests"][0]["token_ids"]
    code, out, err = run_main(["infer", str(art_eager), "--emulate", *args], capsys)
    assert code == 0 and "emulated on the CPU by qvl, no NPU" in out, err


# -------------------------------------------------------------------------------- logits vs transformers


@pytest.fixture(scope="module")
def logits_inputs(art, media):
    return image_prompt_inputs(art, media["img576"])


@pytest.fixture(scope="module")
def reference_logits(tiny, logits_inputs):
    from transformers import Qwen3VLForConditionalGeneration

    model = Qwen3VLForConditionalGeneration.from_pretrained(str(tiny)).eval()
    return generate_logits(model, logits_inputs, N)


def _emulated_logits(art: Path, inputs: Any) -> tuple[list[int], Any]:
    return generate_logits(emulated_model(art), inputs, N)


def test_logits_agree_with_transformers_in_fp32(art, logits_inputs, reference_logits):
    tokens, logits = _emulated_logits(art, logits_inputs)
    ref_tokens, ref_logits = reference_logits
    assert tokens == ref_tokens
    assert (logits - ref_logits).abs().max().item() < 1e-4


def test_negative_control_kv_not_shared_between_prefill_and_decoder_fails(art, logits_inputs, reference_logits):
    """The same check with every graph on its own KV buffers: the decoder no longer sees the prompt."""
    from qwenvl_rbln.backends.emulator import rebel_api

    rebel_api.state.share_static_buffers = False
    try:
        tokens, logits = _emulated_logits(art, logits_inputs)
    finally:
        rebel_api.state.share_static_buffers = True
    ref_tokens, ref_logits = reference_logits
    assert (logits[1:] - ref_logits[1:]).abs().max().item() > 1e-2  # the first token comes from the prefill
    assert (logits[0] - ref_logits[0]).abs().max().item() < 1e-4


# --------------------------------------------------------------------------------------------- bad input


def _one_line(code: int, err: str, want_code: int = 2) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("qvl: error:")]
    assert code == want_code and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_emulate_on_a_torch_preset_is_refused_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "o"
    code, _, err = run_main(["compile", "--preset", "cpu-tiny", "--emulate", "-o", str(out)], capsys)
    line = _one_line(code, err)
    assert "--emulate" in line and "backend torch" in line and "drop --emulate" in line
    assert not out.exists()


def test_emulate_beside_a_real_rebel_is_refused(tmp_path, capsys, monkeypatch):
    from qwenvl_rbln.backends import emulator

    emulator.deactivate()
    monkeypatch.setitem(sys.modules, "rebel", types.ModuleType("rebel"))  # stands for rebel-compiler
    out = tmp_path / "o"
    code, _, err = run_main(["compile", "--preset", "cpu-tiny-rbln", "--emulate", "-o", str(out)], capsys)
    line = _one_line(code, err)
    assert "--emulate" in line and "real rebel-compiler is installed" in line and not out.exists()
    assert "fix: drop --emulate and unset QVL_EMULATE_NPU" in line
    monkeypatch.setenv("QVL_EMULATE_NPU", "1")
    code, _, err = run_main(["compile", "--preset", "cpu-tiny-rbln", "-o", str(out)], capsys)
    assert "QVL_EMULATE_NPU" in _one_line(code, err) and not out.exists()


def test_an_emulated_artifact_is_refused_on_a_real_host(art, media, capsys, monkeypatch):
    from qwenvl_rbln.backends import emulator

    emulator.deactivate()
    monkeypatch.setitem(sys.modules, "rebel", types.ModuleType("rebel"))
    before = _tree(art)
    code, _, err = run_main(["load-check", str(art), "--calibrate"], capsys)
    line = _one_line(code, err)
    assert "compiled by qvl's CPU emulator" in line and "--emulate" in line and "fix:" in line
    code, _, err = run_main(["infer", str(art), "--prompt", "Hi", "--max-new-tokens", "2"], capsys)
    assert "compiled by qvl's CPU emulator" in _one_line(code, err)
    assert _tree(art) == before  # nothing written into the artifact


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and mtime: equal before and after means nothing was written."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def _copy(art: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(art, dst)
    return dst


def test_tampered_and_foreign_graph_files_are_refused(art, tmp_path, capsys):
    bad = _copy(art, tmp_path)
    data = bytearray((bad / "prefill.rbln").read_bytes())
    data[-100] ^= 0xFF  # one weight byte
    (bad / "prefill.rbln").write_bytes(bytes(data))
    before = _tree(bad)
    code, _, err = run_main(["load-check", str(bad), "--emulate"], capsys)
    line = _one_line(code, err)
    assert "prefill.rbln" in line and "modified" in line and "qvl compile --emulate --force" in line
    code, _, err = run_main(["infer", str(bad), "--emulate", "--prompt", "Hi", "--max-new-tokens", "2"], capsys)
    assert "prefill.rbln" in _one_line(code, err)
    assert _tree(bad) == before  # refused without writing anything

    (bad / "prefill.rbln").write_bytes((art / "prefill.rbln").read_bytes())
    (bad / "decoder_batch_1.rbln").write_bytes(b"RBLN\x00 a graph from somewhere else" * 10)
    code, _, err = run_main(["load-check", str(bad), "--emulate"], capsys)
    line = _one_line(code, err)
    assert "decoder_batch_1.rbln" in line and "not written by qvl's emulator" in line
    assert "fix:" in line and "qvl compile --emulate" in line


def test_loading_a_graph_never_unpickles(tmp_path):
    from qwenvl_rbln.backends.emulator import rebel_api

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    evil = tmp_path / "evil.rbln"
    evil.write_bytes(pickle.dumps({"graph": Payload()}))
    with pytest.raises(RuntimeError, match="refuses"):
        rebel_api.RBLNCompiledModel(evil)
    assert not marker.exists()


def test_an_artifact_from_another_optimum_rbln_version_is_refused(art, tmp_path, capsys):
    old = _copy(art, tmp_path)
    cfg = json.loads((old / "rbln_config.json").read_text())
    cfg["optimum_rbln_version"] = "0.11.1"
    (old / "rbln_config.json").write_text(json.dumps(cfg))
    (old / "qvl-manifest.json").unlink()
    code, _, err = run_main(["load-check", str(old), "--emulate"], capsys)
    line = _one_line(code, err)
    assert "rbln_config.json" in line and "0.11.1" in line and "optimum-rbln==0.11.1" in line


def test_real_npu_graphs_are_not_run_by_the_emulator(tmp_path, capsys):
    from qwenvl_rbln.planning.plan import build_plan
    from tests.fakes_rbln import write_artifact

    plan = build_plan("cpu-tiny-rbln")
    out = write_artifact(tmp_path / "real", plan)
    code, _, err = run_main(["load-check", str(out), "--emulate"], capsys)
    line = _one_line(code, err)
    assert "emulator did not write" in line and "drop --emulate" in line
