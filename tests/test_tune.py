"""qvl tune: the tuned preset passes its own dry run, its choices equal bucket-plan's, the product document's cases
come out as documented, every built-in model can be tuned, a need nothing meets exits 4 naming the nearest."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from qwenvl_rbln.errors import DoesNotFit, InputError
from qwenvl_rbln.planning.catalogue.devices import REBEL100_COMPUTE, compute_spec
from qwenvl_rbln.planning.catalogue.modelinfo import BUILTIN, BUILTIN_IDS, QWEN3_VL_2B
from qwenvl_rbln.tuning.roofline import LABEL, Roofline
from qwenvl_rbln.tuning.search import Needs, largest
from qwenvl_rbln.tuning.tune import run_tune
from tests.helpers_cli import run_qvl

SIZES = [(1920, 1080), (1280, 720), (640, 480), (3840, 2160), (512, 512)]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A 200-line workload (some multi-image requests) and a 300-step batch trace between 1 and 4."""
    root = tmp_path_factory.mktemp("tune")
    rng = random.Random(7)
    lines = []
    for _ in range(200):
        w, h = rng.choice(SIZES)
        entry = {"width": w + rng.randint(-30, 30), "height": h + rng.randint(-30, 30), "count": rng.randint(1, 4)}
        if rng.random() < 0.15:
            entry["images"] = rng.randint(2, 3)
        lines.append(json.dumps(entry))
    (root / "wl.jsonl").write_text("\n".join(lines) + "\n")
    (root / "trace.txt").write_text("\n".join(str(rng.randint(1, 4)) for _ in range(300)) + "\n")
    return {"workload": root / "wl.jsonl", "trace": root / "trace.txt", "root": root}


def _tune(files, **needs):
    trace = needs.pop("trace", None)
    return run_tune(Needs(model=needs.pop("model", None), **needs), files["workload"], trace)


# --- the tuned preset ----------------------------------------------------------------------------------------------


def test_written_preset_fits_in_its_own_dry_run(files):
    out = files["root"] / "tuned.yaml"
    res = run_qvl("tune", "-w", str(files["workload"]), "--batch-trace", str(files["trace"]), "--context", "32768",
                  "--min-batch", "4", "-o", str(out), "--json")  # fmt: skip
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["preset_verdict"] == "fits" and doc["preset_path"] == str(out)
    preset = yaml.safe_load(out.read_text())
    assert "roofline bound, not measured" in preset["description"] and "32768" in preset["description"]
    dry = run_qvl("compile", "--preset", str(out), "--dry-run", "--json")
    assert dry.exit_code == 0, dry.stderr
    assert json.loads(dry.stdout)["memory"]["verdict"] == "fits"
    assert doc["commands"]["compile"] == f"qvl compile --preset {out}"
    assert doc["commands"]["serve"] == "qvl serve qvl-out/tuned"
    vllm = doc["commands"]["vllm"]
    assert vllm[vllm.index("--max-model-len") + 1] == str(preset["rbln_config"]["max_seq_len"])
    assert vllm[vllm.index("--max-num-seqs") + 1] == str(preset["rbln_config"]["batch_size"])

    # its ViT buckets are bucket-plan --optimize 3's on the same workload (same base preset)
    bp = run_qvl("bucket-plan", "--workload", str(files["workload"]), "--optimize", "3", "--json")
    assert bp.exit_code == 0, bp.stderr
    assert preset["rbln_config"]["visual"]["max_seq_len"] == json.loads(bp.stdout)["optimized"]["buckets"]
    # its decoder graphs are --optimize-decoder 3's on the same trace, for its batch
    dec = run_qvl("bucket-plan", "--preset", str(out), "--batch-trace", str(files["trace"]), "--optimize-decoder",
                  "3", "--json")  # fmt: skip
    assert dec.exit_code == 0, dec.stderr
    chosen = json.loads(dec.stdout)["decoder"]["optimized"]["decoder_batch_sizes"]
    assert sorted(preset["rbln_config"]["decoder_batch_sizes"]) == sorted(chosen)


def test_human_output_prints_the_preset_and_the_commands(files):
    res = run_qvl("tune", "-w", str(files["workload"]), "--context", "32768", "--min-batch", "4")
    assert res.exit_code == 0, res.stderr
    assert "roofline bound, not measured" in res.stdout
    assert "rejected neighbours" in res.stdout and "why it lost" in res.stdout
    assert "qvl compile --preset tuned.yaml" in res.stdout and "vllm serve qvl-out/tuned" in res.stdout
    preset = yaml.safe_load(res.stdout[res.stdout.index("# Written by `qvl tune`") :])
    assert preset["rbln_config"]["max_seq_len"] == 32768


# --- the product document's cases (Qwen3-VL-2B on Rebel100) ----------------------------------------------------------


def test_batch4_at_full_context_does_not_fit_beside_the_vit_on_one_card(files):
    doc, error = _tune(files, context=262144, min_batch=4, devices=1)
    assert isinstance(error, DoesNotFit) and "best" not in doc
    assert [f["largest_batch"] for f in doc["frontier"] if f["kvcache_partition_len"] == 8192] == [2]
    gives = {tuple(row["gives_up"]) for row in doc["nearest"]}
    assert ("batch: 2 < --min-batch 4",) in gives
    assert ("a second NPU (--devices 2)",) in gives
    assert any(g[0].startswith("context: ") for g in gives)
    assert "nearest" in error.message and "gives up" in error.message
    assert all(row["verdict"] == "fits" for row in doc["nearest"])


def test_two_devices_move_the_vit_to_device_1(files):
    doc, error = _tune(files, context=262144, min_batch=4, devices=2)
    assert error is None
    best = doc["best"]
    assert best["placement"] == {"device": 0, "visual_device": 1}
    assert best["max_seq_len"] == 262144 and best["batch_size"] >= 4
    assert doc["preset"]["placement"] == {"device": 0, "visual_device": 1}
    assert doc["commands"]["env"] == {
        "RBLN_DEVICES": "0,1",  # serve's line for the installed vllm-rbln (0.11), else the default (0.11.1a1)
        "QVL_VIT_PACKING": "1",
        "QVL_FRAME_CAP": "1",
        "QVL_SORT_DECODE": "1",  # batch >= 4 with flash attention for RBLN-CR13: _requires_batch_sort
        "VLLM_NO_USAGE_STATS": "1",  # nothing leaves the host by default
    }


def test_one_device_offers_32768_at_batch_4(files):
    doc, error = _tune(files, context=32768, min_batch=4, devices=1, objective="latency")
    assert error is None
    best = doc["best"]
    assert (best["batch_size"], best["max_seq_len"], best["placement"]["visual_device"]) == (4, 32768, 0)
    assert best["verdict"] == "fits" and doc["preset_verdict"] == "fits"
    assert best["decoder_batch_sizes"] == [1, 2, 4]  # no trace: the powers of two, as the document compiles


def test_one_device_full_context_gives_the_largest_batch(files):
    # two requests in flight: the largest batch that fits at the full context, 2 (batch 3 does not fit)
    doc, error = _tune(files, context=262144, devices=1, concurrency=2)
    assert error is None
    best = doc["best"]
    assert (best["batch_size"], best["max_seq_len"]) == (2, 262144)
    bigger = next(n for n in doc["neighbours"] if n["change"] == "batch_size 3")
    assert not bigger["counts"] and bigger["why"]
    # no trace and no --concurrency: ranked at half the largest batch (1 request), which batch 1 carries as fast
    doc, _ = _tune(files, context=262144, devices=1)
    assert [f["largest_batch"] for f in doc["frontier"] if f["kvcache_partition_len"] == 8192] == [2]
    assert doc["best"]["batch_size"] == 1 and doc["cost_model"]["load"]["lighter_load"] == 1


def test_a_need_nothing_meets_exits_4_naming_the_nearest(files):
    res = run_qvl("tune", "-w", str(files["workload"]), "--context", "262144", "--min-batch", "64", "--json")
    assert res.exit_code == 4
    doc = json.loads(res.stdout)
    assert doc["error"]["exit_code"] == 4 and doc["nearest"]
    for row in doc["nearest"]:
        assert row["gives_up"] and row["verdict"] == "fits" and row["set"]
    assert "gives up" in res.stderr and "--min-batch 64" in res.stderr


# --- the search ------------------------------------------------------------------------------------------------------


def test_neighbours_say_why_they_lost(files):
    doc, _ = _tune(files, context=32768, min_batch=4, trace=files["trace"])
    why = {n["change"]: n["why"] for n in doc["neighbours"]}
    assert why["batch_size 3"] == "below the need: batch 3 < --min-batch 4"
    assert why["max_seq_len 24576"] == "context too short: 24576 < --context 32768"
    assert why["ViT on device 1"] == "needs a second NPU: pass --devices 2"
    assert why["ViT buckets [16384] (preset)"].startswith("slower by ")
    for n in doc["neighbours"]:  # a faster neighbour that meets the needs would have been the answer
        if n["why"].startswith(("slower by", "no faster")):
            assert n["score"] >= doc["best"]["score"] - 1e-12
        elif n["score"] is not None:
            assert n["why"].startswith(
                ("below the need", "needs a second NPU", "context too short", "longer than needed", "faster by")
            ) or n["why"].endswith("> --max-buckets 3 (each is a compiled graph)")
        if n["change"].startswith(("ViT buckets", "decoder graphs")) and n["change"].count(",") >= 3:
            assert n["why"].startswith(f"{n['change'].count(',') + 1} graphs > --max-buckets 3"), n["why"]


def test_candidates_are_plain_rows_for_a_plot(files):
    doc, _ = _tune(files, context=32768, trace=files["trace"], devices=2)
    rows = json.loads(json.dumps(doc["candidates"]))
    assert rows and all(r["verdict"] == "fits" and r["counts"] for r in rows)
    for r in rows:
        est = r["estimate"]
        assert est["label"] == LABEL
        assert est["output_tokens_per_s"] > 0 and est["ttft_s"] > 0 and est["tpot_s"] > 0
    assert [r["score"] for r in rows] == sorted(r["score"] for r in rows)


def test_search_is_not_brute_force(files):
    doc, _ = _tune(files, context=32768, devices=2, trace=files["trace"])
    # 2 placements x 3 partitions x 256 batches x 32 contexts would be ~49,000 planner calls
    assert doc["searched"] < 400


def test_largest_is_a_binary_search():
    calls = []

    def pred(x):
        calls.append(x)
        return x <= 37

    assert largest(pred, 1, 256) == 37 and len(calls) <= 10
    assert largest(lambda x: False, 1, 256) == 0


@pytest.mark.parametrize(
    "bad",
    [{"context": 300000}, {"devices": 3}, {"min_batch": 0}, {"objective": "cost"}, {"device_memory": "120"}],
)
def test_bad_needs_are_input_errors(files, bad):
    needs = {"context": 32768, **bad}
    with pytest.raises(InputError):
        _tune(files, **needs)


# --- every model the planner knows -----------------------------------------------------------------------------------


@pytest.mark.parametrize("model", sorted({BUILTIN_IDS[k] for k in BUILTIN}))
def test_every_builtin_model_can_be_tuned(files, model):
    doc, error = _tune(files, model=model, context=32768)
    if error is None:
        assert doc["best"]["verdict"] == "fits" and doc["preset_verdict"] == "fits"
        assert doc["preset"]["model"] == model
        assert doc["best"]["estimate"]["output_tokens_per_s"] > 0
    else:  # a model that cannot fit one card at all says so, with what it tried
        assert isinstance(error, DoesNotFit) and "no configuration meets the needs" in error.message


@pytest.mark.parametrize("devices", [1, 2])
def test_235b_exits_4_honestly_naming_no_configuration_that_cannot_fit(files, devices):
    doc, error = _tune(files, model="Qwen/Qwen3-VL-235B-A22B-Instruct", context=32768, devices=devices)
    assert isinstance(error, DoesNotFit) and error.exit_code == 4
    assert doc["nearest"] == [] and "best" not in doc  # nothing offered: every configuration was refused
    assert {f["largest_batch"] for f in doc["frontier"]} == {0} and len(doc["frontier"]) == 3 * devices
    # the reason is the planner's (the weights alone exceed the card), not a need to relax: no "--devices 2" advice
    assert "LM weights alone" in error.message and "Qwen3-VL-30B-A3B" in error.hint
    assert "--devices" not in error.hint and "--context" not in error.hint


def test_no_neighbour_that_meets_the_needs_beats_the_chosen_moe(files):
    """A MoE's decode step reads more experts with every row, so its cost is not monotone in the batch: the
    sampled batches (ends, powers of two, the trace's top) are refined from #1 until no neighbour ranks higher."""
    doc, error = _tune(files, model="Qwen/Qwen3-VL-30B-A3B-Instruct", context=32768, trace=files["trace"], devices=2)
    assert error is None
    best = doc["best"]["score"]
    searched = ("batch_size", "kvcache_partition_len", "ViT on", "ViT beside")
    for n in doc["neighbours"]:
        if n["change"].startswith(searched) and n["counts"]:  # --min-batch is 1: every batch meets it
            assert n["score"] >= best, n["change"]
        if n["score"] is not None and n["score"] < best * (1 - 1e-3):  # faster: it says why it is not #1
            assert n["why"].startswith("faster by") or "> --max-buckets" in n["why"], n["why"]
            assert not n["why"].startswith("no faster")
    assert [r["score"] for r in doc["candidates"]][0] == best


# --- the cost model --------------------------------------------------------------------------------------------------


def test_catalogue_cites_every_roofline_figure():
    spec = compute_spec("RBLN-CR13")
    assert (spec.fp16_flops, spec.fp8_flops, spec.hbm_bytes_per_s, spec.chiplets) == (1e15, 2e15, 4.8e12, 4)
    assert len(spec.sources) >= 2 and all(src for _, src in spec.sources)
    with pytest.raises(InputError):
        compute_spec("RBLN-CA25")


def test_roofline_decode_is_weight_bound_and_vit_compute_bound():
    from qwenvl_rbln.memory.params import lm_params
    from qwenvl_rbln.vision.buckets import vit_flops

    roof = Roofline(QWEN3_VL_2B, REBEL100_COMPUTE)
    weights = lm_params(QWEN3_VL_2B.text)["device"] * 2
    step = roof.decode_step(1, 1, 1000, 8192)
    assert step == pytest.approx((weights + 1000 * roof.kv_bytes_per_token) / 4.8e12)
    assert roof.vit_call(16384) == pytest.approx(vit_flops(16384, QWEN3_VL_2B.vision) / 1e15)
    assert roof.decode_step(4, 4, 1000, 8192) > step  # more rows read more KV


def test_measured_timings_replace_the_roofline(tmp_path):
    from qwenvl_rbln.memory.calibration import model_key
    from qwenvl_rbln.tuning.measured import load_measured
    from qwenvl_rbln.tuning.measured_roofline import MeasuredRoofline

    path = tmp_path / "timings.json"
    point = {"context": 1000, "median_s": 0.005, "p10_s": 0.005, "p90_s": 0.005, "min_s": 0.005, "max_s": 0.005}
    entry = {"model_key": model_key(QWEN3_VL_2B), "npu": "RBLN-CR13", "profiled_at": "2026-12-03T00:00:00+00:00",
             "graphs": {"decoder_batch_1/block8192": {"points": [point], "fit": None}}}  # fmt: skip
    path.write_text(json.dumps({"format": "qvl-timings", "version": 2, "entries": {"k": entry}, "emulated": {}}))
    measured = load_measured(model_key(QWEN3_VL_2B), "RBLN-CR13", path)
    roof = MeasuredRoofline(QWEN3_VL_2B, REBEL100_COMPUTE, measured=measured)
    assert roof.decode_step(1, 1, 1000, 8192) == 0.005
    assert "measured" in roof.label() and "decoder_batch_1/block8192" in roof.label()
    path.write_text("{}")
    with pytest.raises(InputError):
        load_measured(model_key(QWEN3_VL_2B), "RBLN-CR13", path)
    path.write_text(json.dumps({"format": "qvl-timings", "version": 1, "entries": {}}))  # the hand-written format
    with pytest.raises(InputError, match="version 1"):
        load_measured(model_key(QWEN3_VL_2B), "RBLN-CR13", path)


def test_roofline_moe_reads_the_routed_experts_only():
    from dataclasses import dataclass, field

    from qwenvl_rbln.planning.catalogue.modelinfo import ModelGeometry, TextGeometry

    @dataclass(frozen=True)
    class Moe:
        num_experts: int = 128
        num_experts_per_tok: int = 8
        moe_intermediate_size: int = 768

        def sparse_layers(self, layers: int) -> int:
            return layers

    @dataclass(frozen=True)
    class MoeText(TextGeometry):
        moe: Moe = field(default_factory=Moe)

    base = QWEN3_VL_2B.text
    text = MoeText(**{k: getattr(base, k) for k in TextGeometry.__dataclass_fields__ if k != "moe"})
    roof = Roofline(ModelGeometry("moe", text, QWEN3_VL_2B.vision), REBEL100_COMPUTE)
    per_token, read_one = roof.lm_params_read(1)
    _, read_many = roof.lm_params_read(64)
    assert per_token == read_one  # one row reads exactly the experts it computes
    assert read_one < read_many  # more rows route to more distinct experts
    every = roof.lm_params_read(10_000)[1]  # so many rows route to every expert
    expert = 3 * text.hidden_size * 768
    assert read_many < every and every - read_one == pytest.approx(text.num_hidden_layers * (128 - 8) * expert)


@pytest.mark.parametrize(
    "key,active", [("qwen/qwen3-vl-30b-a3b-instruct", 3e9), ("qwen/qwen3-vl-235b-a22b-instruct", 22e9)]
)
def test_builtin_moe_decode_reads_its_active_params_prefill_every_expert(key, active):
    from qwenvl_rbln.memory.params import lm_params

    roof = Roofline(BUILTIN[key], REBEL100_COMPUTE)
    per_token, read = roof.lm_params_read(1)
    assert per_token == read == pytest.approx(active, rel=0.05)  # the A3B / A22B of the name: the routed experts
    assert roof.decode_step(1, 1, 1000, 8192) == pytest.approx((2 * read + 1000 * roof.kv_bytes_per_token) / 4.8e12)
    every = lm_params(BUILTIN[key].text)["device"]
    assert roof.lm_params_read(512)[1] == pytest.approx(every, rel=1e-3)  # a 512-row prefill chunk reads them all


def test_device_memory_shrinks_what_fits(files):
    full, _ = _tune(files, context=32768)
    less, _ = _tune(files, context=32768, device_memory="100GiB")
    assert less["frontier"][0]["largest_batch"] < full["frontier"][0]["largest_batch"]


def test_a_local_model_directory_is_tuned_with_its_own_geometry(files, tmp_path):
    from dataclasses import asdict

    from qwenvl_rbln.planning.catalogue.modelinfo import QWEN3_VL_8B

    text, vision = asdict(QWEN3_VL_8B.text), asdict(QWEN3_VL_8B.vision)
    text.pop("moe", None)
    tied = text.pop("tie_word_embeddings")
    config = {"model_type": "qwen3_vl", "tie_word_embeddings": tied, "text_config": text, "vision_config": vision}
    (tmp_path / "config.json").write_text(json.dumps(config))
    big, error = _tune(files, model=str(tmp_path), context=32768, min_batch=4)
    small, _ = _tune(files, context=32768, min_batch=4)
    assert error is None and big["preset"]["model"] == str(tmp_path) and big["preset_verdict"] == "fits"
    # a larger model leaves less room for KV and reads more weights per decode step
    assert big["frontier"][0]["largest_batch"] < small["frontier"][0]["largest_batch"]
    assert big["best"]["estimate"]["tpot_s"] > small["best"]["estimate"]["tpot_s"]


def test_output_must_be_a_yaml_file(files):
    res = run_qvl("tune", "-w", str(files["workload"]), "--context", "32768", "-o", str(files["root"] / "x.txt"))
    assert res.exit_code == 2 and ".yaml" in res.stderr and not (files["root"] / "x.txt").exists()
