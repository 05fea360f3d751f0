"""The packed ViT forward against optimum-rbln 0.12.0's own ``RBLNQwen3VLVisionModel.forward``.

The "compiled graph" here is optimum-rbln's own ``Qwen3VLVisionModelWrapper`` (the module it compiles: the same
mask handling, blocks, merger and DeepStack mergers) around a small random transformers ``Qwen3VLVisionModel``,
run in torch on the CPU. The ViT instance is the real optimum-rbln class, set up by its own ``__post_init__``
from a ``torch_artifacts.pth`` as it is at load, so both forwards (theirs and ours) run unmodified. optimum.rbln
is imported with qvl's CPU emulator standing in for ``rebel``. Emulated: no NPU numerics are claimed.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from qwenvl_rbln.backends import vit_packing as vp  # noqa: E402
from qwenvl_rbln.vision.packing import Pack, PackPlan, plan_packs  # noqa: E402

BUCKETS = [64, 256, 1024]
# bf16 tolerance (documented in docs/bucket-plan.md, "ViT packing"): packed and unpacked bf16 differ at rounding
# level only, measured to stay below bf16's own error against fp32. Tested: max |packed - unpacked| <= the larger of
# 2**-5 * max|fp32 output| and bf16's own max error against fp32 on the same inputs.
BF16_REL = 2.0**-5


def _optimum_vision():
    """optimum-rbln's ViT class and graph wrapper, imported with the emulator as ``rebel``."""
    from qwenvl_rbln.backends import emulator

    with emulator.active(), emulator.quiet_optimum_import():
        from optimum.rbln.transformers.models.qwen3_vl import modeling_qwen3_vl as m
        from optimum.rbln.transformers.models.qwen3_vl.qwen3_vl_architecture import Qwen3VLVisionModelWrapper
    return m.RBLNQwen3VLVisionModel, Qwen3VLVisionModelWrapper


class Graph:
    """A compiled ViT graph stand-in: the wrapper's forward in torch, counting calls and keeping the inputs."""

    def __init__(self, wrapper):
        self.wrapper = wrapper
        self.calls: list[tuple] = []

    def __call__(self, hidden, mask, cos, sin):
        self.calls.append((hidden.clone(), mask.clone(), cos.clone(), sin.clone()))
        with torch.no_grad():
            return self.wrapper(hidden, mask, cos, sin)


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    cls, wrapper_cls = _optimum_vision()
    cfg = Qwen3VLVisionConfig(
        depth=3,
        hidden_size=64,
        intermediate_size=128,
        num_heads=4,
        out_hidden_size=48,
        patch_size=16,
        spatial_merge_size=2,
        temporal_patch_size=2,
        num_position_embeddings=2304,
        deepstack_visual_indexes=[0, 1, 2],
        hidden_act="gelu_pytorch_tanh",
    )
    torch.manual_seed(0)
    model = Qwen3VLVisionModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.125)
    root = tmp_path_factory.mktemp("vit")
    (root / "visual").mkdir()
    torch.save(
        {"patch_embed": model.patch_embed.state_dict(), "pos_embed": model.pos_embed.state_dict()},
        root / "visual" / "torch_artifacts.pth",
    )
    return types.SimpleNamespace(cls=cls, wrapper_cls=wrapper_cls, cfg=cfg, model=model, root=root)


def make_visual(parts, dtype=torch.float32, buckets=BUCKETS):
    """A loaded RBLNQwen3VLVisionModel as optimum-rbln builds it at load, on a Graph instead of a runtime."""
    import copy

    model = copy.deepcopy(parts.model).to(dtype)
    rbln_config = types.SimpleNamespace(dtype=dtype, max_seq_len=list(buckets))
    v = parts.cls.__new__(parts.cls)
    v.__dict__.update(
        config=parts.cfg,
        rbln_config=rbln_config,
        model=[Graph(parts.wrapper_cls(model, rbln_config).eval())],
        model_save_dir=Path(parts.root),
        subfolder="visual",
    )
    parts.cls.__post_init__(v)
    return v


def pixels(grids, seed=1):
    g = torch.Generator().manual_seed(seed)
    n = sum(t * h * w for t, h, w in grids)
    return torch.randn(n, 3 * 2 * 16 * 16, generator=g), torch.tensor(grids)


# images of 36, 400, 144 patches, a 3-temporal-patch video of 16 each, a 600-patch image
GRIDS = [[1, 6, 6], [1, 20, 20], [1, 12, 12], [3, 4, 4], [1, 20, 30]]


def run(visual, grids, seed=1):
    pv, thw = pixels(grids, seed)
    with torch.no_grad():
        return visual(pv, thw)


def maxdiff(a, b):
    main = (a[0].float() - b[0].float()).abs().max().item()
    deep = max((x.float() - y.float()).abs().max().item() for x, y in zip(a[1], b[1], strict=True))
    return max(main, deep)


@pytest.fixture(scope="module")
def fp32(parts):
    """(unpacked result, unpacked graph calls, packed result, packed graph calls, packed log) on GRIDS."""
    off = make_visual(parts)
    off_log = vp.install_on_instance(off, enabled=False)
    ref = run(off, GRIDS)
    on = make_visual(parts)
    log = vp.install_on_instance(on)
    got = run(on, GRIDS)
    return types.SimpleNamespace(
        ref=ref, ref_calls=len(off.transformer.calls), off_log=off_log, got=got, on=on, log=log
    )


def test_fp32_equal_main_and_deepstack(fp32):
    assert fp32.got[0].shape == fp32.ref[0].shape and len(fp32.got[1]) == len(fp32.ref[1]) == 3
    assert maxdiff(fp32.got, fp32.ref) <= 1e-5


def test_call_count_drops_as_planned(fp32):
    lengths = [36, 400, 144, 16, 16, 16, 600]
    plan = plan_packs(lengths, BUCKETS, vp._cost(fp32.on))
    assert fp32.ref_calls == 7 and len(fp32.on.transformer.calls) == plan.calls < 7
    (entry,) = fp32.log.entries
    assert entry["packed"] and entry["graph_calls"] == plan.calls and entry["lengths"] == lengths
    assert [p["bucket"] for p in entry["packs"]] == [p.bucket for p in plan.packs]
    (off,) = fp32.off_log.entries
    assert not off["packed"] and off["graph_calls"] == 7 == fp32.ref_calls


def test_padding_is_zeros_and_masks_block_diagonal(fp32):
    plan = plan_packs([36, 400, 144, 16, 16, 16, 600], BUCKETS, vp._cost(fp32.on))
    for pack, (hidden, mask, cos, _sin) in zip(plan.packs, fp32.on.transformer.calls, strict=True):
        assert hidden.shape[0] == pack.bucket and torch.isfinite(hidden).all()
        valid = torch.zeros(pack.bucket, dtype=torch.bool)
        expect = torch.zeros(pack.bucket, pack.bucket)
        for start, length in zip(pack.starts, pack.lengths, strict=True):
            valid[start : start + length] = True
            expect[start : start + length, start : start + length] = 1
        assert (hidden[~valid] == 0).all() and (cos[0, 0][~valid] == 0).all()
        assert torch.equal(mask[0, 0], expect)


def test_order_preserved_when_one_pack_mixes_buckets(parts):
    # 40 and 16 patches would use bucket 64 alone, 200 uses 256: all three share one 256 call
    grids = [[1, 4, 10], [1, 10, 20], [1, 4, 4]]
    off = make_visual(parts)
    vp.install_on_instance(off, enabled=False)
    on = make_visual(parts)
    log = vp.install_on_instance(on)
    ref, got = run(off, grids, seed=3), run(on, grids, seed=3)
    (pack,) = log.entries[0]["packs"]
    assert pack["bucket"] == 256 and pack["segments"] == [1, 0, 2]  # placed largest first
    assert [c[0].shape[0] for c in off.transformer.calls] == [64, 256, 64]
    assert maxdiff(got, ref) <= 1e-5
    # each segment's rows are its own: swapping two segments' outputs would be caught
    assert (got[0][:10] - ref[0][:10]).abs().max() <= 1e-5 and (ref[0][:10] - ref[0][10:20]).abs().max() > 1e-2


def test_alignment_matters(parts):
    """Starts on the 4-patch merge unit are exact; a start 2 rows off mixes two segments in one merged token."""
    grids = [[1, 4, 4], [1, 4, 6]]  # 16 and 24 patches
    off = make_visual(parts)
    vp.install_on_instance(off, enabled=False)
    ref = run(off, grids)
    v = make_visual(parts)
    pv, thw = pixels(grids)
    hidden, cos, sin, lengths = vp.host_inputs(v, pv, thw)

    def with_starts(starts):
        plan = PackPlan(lengths, [64], packs=[Pack(64, (0, 1), starts, tuple(lengths))])
        with torch.no_grad():
            return vp.run_packs(v, plan, hidden, cos, sin)

    assert maxdiff(with_starts((0, 16)), ref) <= 1e-5  # aligned (what plan_packs builds)
    assert maxdiff(with_starts((2, 20)), ref) > 1e-2  # first segment starts mid merge unit
    assert plan_packs(lengths, [64]).packs[0].starts == (0, 24)  # the planner only builds aligned starts


def test_bf16_tolerance(parts):
    fp = make_visual(parts)
    vp.install_on_instance(fp, enabled=False)
    ref32 = run(fp, GRIDS)
    off = make_visual(parts, torch.bfloat16)
    vp.install_on_instance(off, enabled=False)
    on = make_visual(parts, torch.bfloat16)
    vp.install_on_instance(on)
    ref, got = run(off, GRIDS), run(on, GRIDS)
    assert got[0].dtype == torch.bfloat16 and len(on.transformer.calls) < len(off.transformer.calls)
    scale = max(ref32[0].abs().max().item(), max(d.abs().max().item() for d in ref32[1]))
    own_error = maxdiff(ref, ref32)  # bf16's own error against fp32
    assert maxdiff(got, ref) <= max(BF16_REL * scale, own_error)


def test_oversize_runs_optimum_forward_unchanged(parts):
    v = make_visual(parts, buckets=[64, 256])
    log = vp.install_on_instance(v)
    with pytest.raises(ValueError, match=r"Required seq_len\(400\) is larger than available max_seq_len"):
        run(v, [[1, 4, 4], [1, 20, 20]])
    assert len(v.transformer.calls) == 1 and not log.entries  # today's loop: the 16-patch call, then the error


def test_install_on_class_and_instance(parts):
    a, b = make_visual(parts), make_visual(parts)
    try:
        assert vp.install_on_class(parts.cls) is parts.cls and vp.install_on_class(parts.cls) is parts.cls
        run(a, [[1, 4, 4], [1, 4, 4]])
        assert len(a.transformer.calls) == 1 and vp.pack_log(a).entries[0]["packed"]
        vp.install_on_instance(b, enabled=False)  # an instance can opt out
        run(b, [[1, 4, 4], [1, 4, 4]])
        assert len(b.transformer.calls) == 2
    finally:
        vp.uninstall_class(parts.cls)
    c = make_visual(parts)
    run(c, [[1, 4, 4], [1, 4, 4]])
    assert len(c.transformer.calls) == 2 and vp.pack_log(c) is None  # the class is optimum-rbln's again


def test_not_optimum_vit_is_left_alone():
    assert vp.install_on_instance(lambda *a: None) is None
    assert vp.install_on_instance(types.SimpleNamespace(transformer=1)) is None


def test_pack_log_is_bounded():
    log = vp.PackLog()
    plan = plan_packs([16, 16], [64])
    for _ in range(vp.LOG_LIMIT + 5):
        log.record(plan, packed=True)
    assert len(log.entries) == vp.LOG_LIMIT and log.graph_calls == vp.LOG_LIMIT
    assert len(log.drain()) == vp.LOG_LIMIT and not log.entries


def test_pack_buffers_are_reused_and_hold_nothing_of_the_previous_call(parts):
    """The pack inputs are kept per bucket (a fresh S x S mask per call was qvl's largest own host cost per image,
    docs/tuning.md "Host time"): a call with other segments in the same bucket sees none of the previous call's."""
    first, second = [[1, 4, 10], [1, 10, 20], [1, 4, 4]], [[1, 8, 8], [1, 4, 6]]
    off = make_visual(parts)
    vp.install_on_instance(off, enabled=False)
    on = make_visual(parts)
    vp.install_on_instance(on)
    assert maxdiff(run(on, first, seed=3), run(off, first, seed=3)) <= 1e-5
    (buf,) = on.__dict__["_qvl_pack_buffers"].values()
    mask = buf["mask"]
    assert maxdiff(run(on, second, seed=4), run(off, second, seed=4)) <= 1e-5  # no stale row or block of the first
    for hidden, m, cos, _sin in on.transformer.calls[-2:]:  # the padding rows are zeros again, not the first's
        valid = m[0, 0].diagonal() > 0
        assert (hidden[~valid] == 0).all() and (cos[0, 0][~valid] == 0).all()
    assert maxdiff(run(on, first, seed=5), run(off, first, seed=5)) <= 1e-5
    assert any(b["mask"] is mask for b in on.__dict__["_qvl_pack_buffers"].values())  # the same mask, not a new one
