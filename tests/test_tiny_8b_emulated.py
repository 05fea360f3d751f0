"""The 8B/32B's shape, emulated: an untied lm_head and a ViT narrower than the text, through optimum-rbln 0.12's real
compile, load and generate on qvl's CPU emulator.

The default tiny model mirrors the 2B (tied head, ViT hidden = text hidden), so without ``qvl:tiny-8b``
(``qvl tiny-model --shape 8b``: ViT hidden 48, text hidden 64, depth 4, deepstack [1, 2, 3]) no emulated run takes the
paths the 8B and 32B take. Its greedy tokens must equal the reference backend's for an image and text, its logits agree
within 1e-4 in fp32, the planner counts what the compiled graphs hold (the separate lm_head included), and bucket-plan
and load-check use its own ViT numbers, not the 2B-shaped tiny model's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.emulated_rbln import optimum_rbln_installed

pytestmark = pytest.mark.skipif(not optimum_rbln_installed(), reason="optimum-rbln is not installed")

from tests.emulated_rbln import emulated_model, generate_logits, image_prompt_inputs  # noqa: E402
from tests.fakes_rbln import run_main  # noqa: E402

N = 6  # new tokens per request
MODEL = "qvl:tiny-8b"


@pytest.fixture(scope="module", autouse=True)
def emulator_scope():
    from tests.emulated_rbln import emulator_on

    with emulator_on():
        yield


@pytest.fixture(scope="module")
def tiny_8b() -> Path:
    from qwenvl_rbln.backends.tiny.model import ensure_tiny_model

    return ensure_tiny_model(shape="8b")


@pytest.fixture(scope="module")
def art(tiny_8b: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.emulated_rbln import compile_emulated

    return compile_emulated(tmp_path_factory.mktemp("tiny-8b") / "art", model=MODEL)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import numpy as np
    from PIL import Image

    path = tmp_path_factory.mktemp("tiny-8b-media") / "img.png"
    rng = np.random.default_rng(5)
    Image.fromarray(rng.integers(0, 255, (384, 512, 3), dtype=np.uint8)).save(path)
    return path


def test_the_variant_is_the_8b_shape(tiny_8b: Path):
    """Untied, ViT hidden below the text hidden, out_hidden_size = text hidden, deepstack not from layer 0: the
    config.json written matches the built-in geometry of qvl:tiny-8b, and differs from qvl:tiny where the 8B does."""
    from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_TINY, QWEN3_VL_TINY_8B, load_geometry

    cfg = json.loads((tiny_8b / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False
    assert cfg["vision_config"]["deepstack_visual_indexes"] == [1, 2, 3]
    geometry, _ = load_geometry(MODEL)
    assert geometry.text == QWEN3_VL_TINY_8B.text and geometry.vision == QWEN3_VL_TINY_8B.vision
    v, t = geometry.vision, geometry.text
    assert not t.tie_word_embeddings and v.hidden_size == 48 < t.hidden_size == v.out_hidden_size == 64
    assert v != QWEN3_VL_TINY.vision and QWEN3_VL_TINY.text.tie_word_embeddings


def test_untied_lm_head_is_in_the_graph_and_the_planner_counts_what_it_holds(art: Path, tiny_8b: Path):
    """The planner's lm.weights (fp32 here) equals the tensors of the emulated prefill graph (0-d constants aside),
    and the (vocab, hidden) tensor in it is the checkpoint's own lm_head, not embed_tokens: the untied head is
    compiled and counted. The ViT graph likewise holds exactly the planner's ViT weights for hidden 48."""
    from safetensors.torch import load_file as load_safetensors

    from qwenvl_rbln.backends.emulator.graph import load_file
    from qwenvl_rbln.memory.params import lm_params, vision_params
    from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_TINY, load_geometry

    header, tensors = load_file(art / "prefill.rbln")
    aliases = header.get("aliases") or {}
    held = {k: t for k, t in tensors.items() if k not in aliases and t.dim() > 0}
    geometry, _ = load_geometry(str(art))
    assert sum(t.numel() * t.element_size() for t in held.values()) == lm_params(geometry.text)["device"] * 4
    weights = load_safetensors(str(tiny_8b / "model.safetensors"))
    head, embed = weights["lm_head.weight"], weights["model.language_model.embed_tokens.weight"]
    assert not head.equal(embed)
    in_graph = [t for t in held.values() if t.shape == head.shape]
    assert len(in_graph) == 1 and in_graph[0].equal(head)

    _, vit = load_file(art / "visual" / "compiled_model.rbln")
    buckets = 3  # one graph per ViT bucket in the file, each with its own weights
    vit_bytes = sum(t.numel() * t.element_size() for t in vit.values() if t.dim() > 0)
    assert vit_bytes == buckets * vision_params(geometry.vision)["device"] * 4
    assert vision_params(geometry.vision)["device"] != vision_params(QWEN3_VL_TINY.vision)["device"]


def _infer(capsys: Any, *args: str) -> dict:
    code, out, err = run_main(["infer", *args, "--json", "--max-new-tokens", str(N)], capsys)
    assert code == 0, err
    return json.loads(out)


def test_tokens_equal_the_reference_for_image_and_text(art, tiny_8b, image, tmp_path, capsys):
    requests = [
        {"id": "image", "prompt": "Describe this image.", "images": [str(image)]},
        {"id": "text", "prompt": "Say hello to the user.", "system": "Be brief."},
    ]
    batch = tmp_path / "requests.jsonl"
    batch.write_text("".join(json.dumps(r) + "\n" for r in requests))
    emu = _infer(capsys, str(art), "--emulate", "--batch-file", str(batch))
    ref = _infer(capsys, str(tiny_8b), "--batch-file", str(batch))
    assert emu["backend"] == "rbln" and emu["emulated"] is True and ref["backend"] == "torch"
    got = {r["id"]: r["token_ids"] for r in emu["requests"]}
    want = {r["id"]: r["token_ids"] for r in ref["requests"]}
    assert got == want and all(len(t) == N for t in got.values())
    assert len({tuple(t) for t in got.values()}) == 2  # different continuations: the inputs matter


def test_logits_agree_with_transformers_in_fp32(art, tiny_8b, image):
    from transformers import Qwen3VLForConditionalGeneration

    inputs = image_prompt_inputs(tiny_8b, image)  # compiled batch 2
    reference = Qwen3VLForConditionalGeneration.from_pretrained(str(tiny_8b)).eval()
    assert reference.lm_head.weight.data_ptr() != reference.model.language_model.embed_tokens.weight.data_ptr()
    ref_tokens, ref_logits = generate_logits(reference, inputs, N)
    tokens, logits = generate_logits(emulated_model(art), inputs, N)
    assert tokens == ref_tokens
    assert (logits - ref_logits).abs().max().item() < 1e-4


# ------------------------------------------------------------------------ bucket-plan and load-check


def test_bucket_plan_uses_the_variants_vit(capsys):
    """FLOPs and workspace per bucket come from qvl:tiny-8b's ViT (hidden 48, depth 4), not from qvl:tiny's."""
    from qwenvl_rbln.memory.workspaces import estimate_for_bucket
    from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_TINY, QWEN3_VL_TINY_8B
    from qwenvl_rbln.vision.buckets import vit_flops

    args = ["bucket-plan", "--preset", "cpu-tiny-rbln", "--size", "640x480", "--json"]
    code, out, err = run_main([*args, "--model", MODEL], capsys)
    assert code == 0, err
    rows = {r["bucket"]: r for r in json.loads(out)["summary"]["buckets"]}
    code, out, err = run_main(args, capsys)
    assert code == 0, err
    tied = {r["bucket"]: r for r in json.loads(out)["summary"]["buckets"]}
    for b, row in rows.items():
        assert row["flops_per_call"] == vit_flops(b, QWEN3_VL_TINY_8B.vision) != tied[b]["flops_per_call"]
        ws = estimate_for_bucket(QWEN3_VL_TINY_8B, b, dtype_bytes=QWEN3_VL_TINY_8B.dtype_bytes)["workspace_bytes"]
        assert row["workspace_bytes"] == ws != tied[b]["workspace_bytes"]
    assert vit_flops(4096, QWEN3_VL_TINY.vision) == tied[4096]["flops_per_call"]


def test_load_check_uses_the_variants_vit(art: Path, capsys):
    """load-check's emulated allocations and the planner's estimate beside them agree on the ViT and the LM of the
    8B-shaped artifact (fp32 graphs, bf16 estimate)."""
    from qwenvl_rbln.memory.params import lm_params, vision_params
    from qwenvl_rbln.memory.workspaces import visual_workspace_parts
    from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_TINY_8B

    code, out, err = run_main(["load-check", str(art), "--emulate", "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["ok"] is True and d["runtime"]["ok"] is True
    graphs = d["memory"]["graphs"]
    items = {i["name"]: i for dev in d["memory"]["estimate"]["devices"] for i in dev["items"]}
    vit = vision_params(QWEN3_VL_TINY_8B.vision)["device"]
    assert graphs["visual/compiled_model"]["by_key"]["Weight"] == vit * 4
    assert items["visual.weights"]["high_bytes"] == vit * 2
    assert items["lm.weights"]["high_bytes"] == lm_params(QWEN3_VL_TINY_8B.text)["device"] * 2
    # the largest bucket's inputs and outputs, as the planner's ViT workspace counts them: hidden [S, 48], cos/sin
    # [S, 12], the S x S mask, and (1 + 3 deepstack) merged outputs [S/4, 64] (fp32)
    low = visual_workspace_parts(QWEN3_VL_TINY_8B, 4096, 4, "low")
    assert graphs["visual/compiled_model"]["by_key"]["IOBuffer"] == low["attention"] + low["io"]
