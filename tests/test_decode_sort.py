"""The plugin's decode batch sort (issue 36 item 4), without vLLM: a stand-in for vllm-rbln's Qwen-VL model class.

optimum-rbln 0.12 refuses a decode batch whose cache positions are not descending for a decoder compiled with
``_requires_batch_sort`` (``_require_sorted_cache_position``); vllm-rbln 0.11.1a1's optimum runner hands it the
batch in its own order. The engine test (tests/test_engine_serve.py) runs the real thing; these pin the wrapper's
contract: the model sees the rows longest first, each row keeps its own block table and request id, and the caller
gets the logits back in its own order.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field

import pytest
import torch

from qwenvl_rbln.serving import decode_sort


@dataclass
class ModelInput:
    """The fields of vllm-rbln's ``ModelInputForRBLN`` the wrapper reads (v0.11.1a1 ``.../optimum/base.py``)."""

    input_tokens: torch.Tensor
    input_positions: torch.Tensor
    block_tables: torch.Tensor
    running_requests_ids: list[str]
    finished_requests_ids: list[str] = field(default_factory=list)
    is_prompt: bool = False


class Model:
    """Refuses unsorted decode batches as optimum-rbln does; answers one logits row per request, naming it."""

    def __init__(self) -> None:
        self.seen: list[ModelInput] = []

    def forward(self, model_input: ModelInput, **kwargs):
        self.seen.append(model_input)
        lengths = model_input.input_positions.reshape(-1)
        if not model_input.is_prompt and not torch.all(lengths[:-1] >= lengths[1:]):
            raise ValueError(f"decode batches must be sorted by sequence length, got {lengths.tolist()}")
        rows = [float(rid[1:]) for rid in model_input.running_requests_ids]  # "r7" -> a row of 7.0
        return torch.tensor(rows).reshape(-1, 1, 1).expand(-1, 1, 3).clone()


def batch(positions: list[int], is_prompt: bool = False) -> ModelInput:
    ids = [f"r{i}" for i in range(len(positions))]
    return ModelInput(
        input_tokens=torch.arange(len(positions)).reshape(-1, 1) + 100,
        input_positions=torch.tensor(positions).reshape(-1, 1),
        block_tables=torch.tensor([[i, i + 10] for i in range(len(positions))]),
        running_requests_ids=ids,
        is_prompt=is_prompt,
    )


def test_an_unsorted_decode_batch_is_run_longest_first_and_answered_in_the_callers_order():
    model = Model()
    with pytest.raises(ValueError, match="sorted"):
        model.forward(batch([12, 111]))  # what the engine hit: two requests of different lengths
    forward = decode_sort.sorted_forward(Model.forward)
    logits = forward(model, batch([12, 111, 40]))
    ran = model.seen[-1]
    assert ran.input_positions.reshape(-1).tolist() == [111, 40, 12]
    assert ran.running_requests_ids == ["r1", "r2", "r0"]
    assert ran.input_tokens.reshape(-1).tolist() == [101, 102, 100]  # each row keeps its token ...
    assert ran.block_tables.tolist() == [[1, 11], [2, 12], [0, 10]]  # ... and its own block table
    assert logits[:, 0, 0].tolist() == [0.0, 1.0, 2.0]  # back in the runner's order


@pytest.mark.parametrize("case", [batch([5, 9], is_prompt=True), batch([30, 30, 2]), batch([7])])
def test_prefill_sorted_and_single_row_batches_pass_unchanged(case):
    model = Model()
    decode_sort.sorted_forward(Model.forward)(model, case)
    assert model.seen[-1] is case


def test_install_wraps_vllm_rblns_class_once_and_only_when_asked(monkeypatch):
    module = types.ModuleType(decode_sort.TARGET_MODULE)
    cls = type(decode_sort.TARGET_CLASS, (Model,), {"forward": Model.forward})
    module.__dict__[decode_sort.TARGET_CLASS] = cls
    monkeypatch.setitem(sys.modules, decode_sort.TARGET_MODULE, module)
    said: list[str] = []
    monkeypatch.delenv(decode_sort.SORT_ENV, raising=False)
    assert decode_sort.install(said.append) is False and cls.forward is Model.forward
    monkeypatch.setenv(decode_sort.SORT_ENV, "1")
    assert decode_sort.install(said.append) and decode_sort.install(said.append)  # vLLM may register twice
    assert cls.forward.__wrapped__ is Model.forward and not said
    assert cls().forward(batch([1, 9]))[:, 0, 0].tolist() == [0.0, 1.0]


def test_a_vllm_rbln_without_the_class_gets_one_warning_naming_the_risk(monkeypatch):
    monkeypatch.setitem(sys.modules, decode_sort.TARGET_MODULE, None)  # not importable
    monkeypatch.setenv(decode_sort.SORT_ENV, "1")
    said: list[str] = []
    assert decode_sort.install(said.append) is False
    assert len(said) == 1 and "_requires_batch_sort" in said[0] and "end" in said[0]


@pytest.mark.parametrize(
    ("npu", "attn", "mask", "sorts"),
    [
        ("RBLN-CR13", "flash_attn", False, True),
        ("RBLN-CR13", "eager", False, False),
        ("RBLN-CR13", "flash_attn", True, False),
        ("RBLN-CR03", "flash_attn", False, False),
        ("RBLN-CA25", "flash_attn", False, False),
    ],
)
def test_which_compiles_need_the_sort_follows_optimum_rbln(npu, attn, mask, sorts):
    """optimum-rbln 0.12's rule (``modeling_decoderonly.py:575``): generating, CR13 or later, flash, no mask."""
    assert decode_sort.compiled_with_sort(npu, attn, mask) is sorts
    cfg = {"_requires_batch_sort": sorts, "batch_size": 2}
    assert decode_sort.needs_sort(cfg) is sorts and not decode_sort.needs_sort({**cfg, "batch_size": 1})


def test_lora_adapter_ids_move_with_their_rows_and_come_back(emulated):
    """Audit 2026-12-04b F4: vllm-rbln sets the adapter ids on optimum-rbln's model in the runner's order
    (``set_lora_int_ids``) and the decoder reads them from there; the sort moved the rows but not the ids, so a sorted
    row decoded with another request's adapter. optimum-rbln's own ``set_lora_int_ids`` runs here, on the decoder
    state it sets (prefill decoder and every decoder batch size)."""
    from optimum.rbln.transformers.models.decoderonly.modeling_decoderonly import RBLNDecoderOnlyModelForCausalLM

    rt = types.SimpleNamespace
    lm = rt(prefill_decoder=rt(), decoders={4: rt()}, rbln_config=rt(can_generate=True, decoder_batch_sizes=[4]))
    lm.set_lora_int_ids = types.MethodType(RBLNDecoderOnlyModelForCausalLM.set_lora_int_ids, lm)
    adapter_of = {"r0": 7, "r1": 3, "r2": 5}  # each request's adapter
    lm.set_lora_int_ids([7, 3, 5, 0])  # runner order, padded with 0 to the batch (set_active_loras)

    class LoraModel(Model):
        model = lm

        def forward(self, model_input, **kwargs):
            used = self.model.decoders[4].lora_int_ids.tolist()  # what the decoder reads when passed none
            self.ran_with = dict(zip(model_input.running_requests_ids, used, strict=False))
            return super().forward(model_input, **kwargs)

    model = LoraModel()
    logits = decode_sort.sorted_forward(LoraModel.forward)(model, batch([12, 111, 40]))
    assert model.seen[-1].running_requests_ids == ["r1", "r2", "r0"]  # it did sort
    assert model.ran_with == adapter_of  # each row with its own adapter
    assert lm.lora_int_ids.tolist() == lm.decoders[4].lora_int_ids.tolist() == [7, 3, 5, 0]  # back in runner order
    assert lm.prefill_decoder.lora_int_ids.tolist() == [7, 3, 5, 0]
    assert logits[:, 0, 0].tolist() == [0.0, 1.0, 2.0]
