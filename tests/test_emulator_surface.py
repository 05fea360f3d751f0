"""qvl's emulated rebel surface without optimum-rbln: the paged attention ops against plain attention, and
compile / save / load / Runtime (static buffers shared per CompileContext, shape dispatch, out=, memory queries)
on toy modules. Fast: no model, no optimum-rbln."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from qwenvl_rbln.artifacts.emulated import is_emulated_file  # noqa: E402
from qwenvl_rbln.backends.emulator import ops, rebel_api  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ops.register()
    yield
    torch.set_num_threads(threads)


def _reference(q, k, v):
    """Causal attention over the full sequence: q [Hkv, G, T, D], k/v [Hkv, T, D]."""
    t = q.shape[2]
    scores = torch.einsum("hgqd,hkd->hgqk", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
    return torch.einsum("hgqk,hkd->hgqd", torch.softmax(scores, -1), v)


@pytest.mark.parametrize("op", ["paged_flash_causal_attn", "paged_causal_attn"])
def test_chunked_prefill_then_decode_through_a_shuffled_block_table_equals_causal_attention(op):
    torch.manual_seed(0)
    hkv, g, d, bs, t = 2, 2, 8, 4, 11  # 11 tokens over blocks of 4: writes cross two block boundaries
    q, k, v = torch.randn(hkv, g, t, d), torch.randn(hkv, t, d), torch.randn(hkv, t, d)
    kc, vc = torch.zeros(5, hkv, bs, d), torch.zeros(5, hkv, bs, d)
    table = torch.tensor([3, 0, 4, -1], dtype=torch.int16)  # logical block i -> physical block table[i]
    scale = torch.tensor(1 / math.sqrt(d))
    prefill = getattr(torch.ops.rbln_custom_ops, f"{op}_prefill")
    decode = getattr(torch.ops.rbln_custom_ops, f"{op}_decode")
    out = []
    for start, stop in ((0, 6), (6, 10)):  # two prefill chunks, then one decode step
        o = prefill(
            q=q[None, :, :, start:stop],
            k=k[None, :, None, start:stop],
            v=v[None, :, None, start:stop],
            kcache=kc.unsqueeze(2),
            vcache=vc.unsqueeze(2),
            seq=torch.tensor([[start]]),
            scale=scale,
            block_table=table,
            block_size=bs,
        )
        out.append(o[0])
    o = decode(
        q=q[None, :, :, 10:11],
        k=k[None, :, None, 10:11],
        v=v[None, :, None, 10:11],
        kcache=kc.unsqueeze(2),
        vcache=vc.unsqueeze(2),
        seq=torch.tensor([[10]]),
        scale=scale,
        block_table=table[None],
        block_size=bs,
    )
    out.append(o[0])
    got = torch.cat(out, dim=2)
    assert torch.allclose(got, _reference(q, k, v), atol=1e-5)
    assert torch.equal(kc[0, :, 0], k[:, 4]) and torch.equal(kc[4, :, 2], k[:, 10])  # written through the table


def test_a_mask_op_with_a_causal_mask_equals_the_causal_op():
    torch.manual_seed(1)
    hkv, g, d, bs, t = 1, 2, 4, 8, 5
    q, k, v = torch.randn(1, hkv, g, t, d), torch.randn(1, hkv, 1, t, d), torch.randn(1, hkv, 1, t, d)
    args = {"q": q, "k": k, "v": v, "seq": torch.tensor([[0]]), "scale": torch.tensor(0.5), "block_size": bs}
    table = torch.tensor([0], dtype=torch.int16)
    a = torch.ops.rbln_custom_ops.paged_causal_attn_prefill(
        kcache=torch.zeros(1, hkv, 1, bs, d), vcache=torch.zeros(1, hkv, 1, bs, d), block_table=table, **args
    )
    mask = torch.tril(torch.ones(t, bs))[None, None, None]
    b = torch.ops.rbln_custom_ops.paged_attn_prefill(
        kcache=torch.zeros(1, hkv, 1, bs, d), vcache=torch.zeros(1, hkv, 1, bs, d), block_table=table, mask=mask, **args
    )
    assert torch.allclose(a, b, atol=1e-6)


def test_cache_update_and_linear():
    cache = torch.zeros(3, 4)
    torch.ops.rbln_custom_ops.rbln_cache_update(cache, torch.ones(1, 4), torch.tensor(2), 0)
    assert cache[2].sum() == 4 and cache[:2].sum() == 0
    x, w, b = torch.randn(2, 3), torch.randn(5, 3), torch.randn(5)
    assert torch.allclose(torch.ops.rbln_custom_ops.linear(x, w, b), torch.nn.functional.linear(x, w, b))


class _Kv(torch.nn.Module):
    """A toy 'LM graph': adds its input into a static cache row and returns the cache sum per row."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((4,), 2.0))

    def forward(self, x, pos, cache):
        cache.index_copy_(0, pos, x * self.w)
        return cache.sum(dim=1, keepdim=True).T


def _compile(ctx, rows):
    info = [("x", [rows, 4], "float32"), ("pos", [rows], "int64"), ("past_key_values_0", [3, 4], "float32")]
    example = [torch.zeros(rows, 4), torch.arange(rows), torch.zeros(3, 4, device="meta")]
    ctx.mark_static_address(example[2], "past_key_values_0")
    return rebel_api.compile_from_torch(
        _Kv(), info, npu="RBLN-CR13", num_devices=1, example_inputs=example, compile_context=ctx
    )


def test_static_buffers_are_shared_per_compile_context_across_save_and_reload(tmp_path):
    ctx = rebel_api.CompileContext(use_weight_sharing=True)
    a, b = _compile(ctx, 2), _compile(ctx, 1)
    a.save(tmp_path / "a.rbln")
    b.save(tmp_path / "b.rbln")
    a2, b2 = rebel_api.RBLNCompiledModel(tmp_path / "a.rbln"), rebel_api.RBLNCompiledModel(tmp_path / "b.rbln")
    ra, rb = rebel_api.Runtime(a2, tensor_type="pt", device=0), rebel_api.Runtime(b2, tensor_type="pt", device=0)
    ra(torch.ones(2, 4), torch.tensor([0, 1]))
    out = torch.empty(1, 3)
    rb(torch.ones(1, 4), torch.tensor([2]), out=out)  # sees the rows graph a wrote
    assert out.tolist() == [[8.0, 8.0, 8.0]]
    # a second load of the same graphs gets its own cache
    ra2 = rebel_api.Runtime(rebel_api.RBLNCompiledModel(tmp_path / "a.rbln"), device=0)
    assert ra2(torch.zeros(2, 4), torch.tensor([0, 1])).tolist() == [[0.0, 0.0, 0.0]]
    with pytest.raises(RuntimeError, match="no compiled graph takes inputs of shapes"):
        ra(torch.ones(5, 4), torch.tensor([0]))
    with pytest.raises(RuntimeError, match="not an emulated NPU"):
        rebel_api.Runtime(a2, device=9)


def test_multi_graph_input_info_dispatches_on_shape_and_memory_queries_use_tensor_sizes(tmp_path):
    lin = torch.nn.Linear(4, 2)
    infos = [[("x", [n, 4], "float32")] for n in (8, 2)]
    cm = rebel_api.compile_from_torch(lin, infos, npu="RBLN-CR13", num_devices=1)
    cm.save(tmp_path / "v.rbln")
    cm = rebel_api.RBLNCompiledModel(tmp_path / "v.rbln")
    rt = rebel_api.Runtime(cm, device=0)
    x = torch.randn(2, 4)
    assert torch.allclose(rt(x), lin(x)) and rt(torch.randn(8, 4)).shape == (8, 2)
    alloc = cm.get_alloc_per_chiplet_by_key()
    assert len(alloc["Weight"][0]) == 4 and sum(alloc["Weight"][0]) == (8 + 2) * 4  # 4 chiplets, fp32 weights
    assert sum(alloc["IOBuffer"][0]) == (8 * 4 + 8 * 2) * 4  # the larger graph's inputs and outputs


def test_kv_buffers_grow_with_exp_multiply_buffer_size(tmp_path):
    cm = _compile(rebel_api.CompileContext(), 1)
    before = cm.exp_get_dram_tensor_sizes()["past_key_values_0"][0]
    cm.exp_multiply_buffer_size({"past_key_values_0": 5})
    assert sum(cm.exp_get_dram_tensor_sizes()["past_key_values_0"][0]) == 5 * sum(before) == 5 * 3 * 4 * 4
    cm.save(tmp_path / "k.rbln")
    assert rebel_api.RBLNCompiledModel(tmp_path / "k.rbln").static_specs()["past_key_values_0"][0] == [15, 4]
    assert is_emulated_file(tmp_path / "k.rbln")


def test_capture_reports_times_graph_calls_as_device_time_and_the_call_hold_makes_each_call_last(monkeypatch):
    lin = torch.nn.Linear(4, 2)
    rt = rebel_api.Runtime(rebel_api.compile_from_torch(lin, [("x", [2, 4], "float32")], npu="RBLN-CR13"), device=0)
    monkeypatch.setenv("QVL_EMULATE_CALL_MS", "30")
    with rebel_api.capture_reports() as reports:
        assert reports == []  # filled on exit, as vllm-rbln reads it after the block
        rt(torch.randn(2, 4))
        rt(torch.randn(2, 4))
    (report,) = reports
    assert report["emulated"] is True and report["calls"] == 2 and report["total_ccl"] == 0.0
    assert report["total_device"] >= 2 * 30_000  # each call held for at least 30 ms, in microseconds
    assert report["total_host"] >= 0
    monkeypatch.setenv("QVL_EMULATE_CALL_MS", "0")
    with rebel_api.capture_reports() as outer:
        with rebel_api.capture_reports() as inner:
            rt(torch.randn(2, 4))
        rt(torch.randn(2, 4))
    assert inner[0]["calls"] == 1 and outer[0]["calls"] == 2  # nested blocks each see their own calls
    monkeypatch.setenv("QVL_EMULATE_CALL_MS", "not-a-number")
    assert rebel_api.call_hold_seconds() == 0.0
