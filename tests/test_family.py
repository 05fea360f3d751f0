"""The dense Qwen3-VL family (2B, 4B, 8B, 32B): built-in cited geometry, the exact numbers optimum-rbln 0.12's
audit found, and hub ids resolved through the local Hugging Face cache (a temporary cache, offline)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.memory.kv import kv_block_bytes_per_tensor, kv_tensor_count
from qwenvl_rbln.memory.params import lm_params, vision_params
from qwenvl_rbln.planning.catalogue import modelinfo
from qwenvl_rbln.planning.catalogue.devices import GiB, MiB
from qwenvl_rbln.planning.catalogue.modelinfo import (
    QWEN3_VL_4B,
    QWEN3_VL_8B,
    QWEN3_VL_32B,
    load_geometry,
)
from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import config_of
from tests.helpers_cli import run_qvl

SHA = "0123456789abcdef0123456789abcdef01234567"


def make_hub_cache(hub: Path, repo_id: str, cfg: dict, sha: str = SHA, extra: dict | None = None) -> Path:
    """The real Hugging Face cache layout: models--Org--Name/refs/main and snapshots/<sha>/config.json."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / sha
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)
    (snap / "config.json").write_text(json.dumps(cfg))
    for name, body in (extra or {}).items():
        (snap / name).write_text(body)
    return snap


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An offline HF_HOME whose hub/ is the cache (HF_HUB_CACHE unset, so HF_HOME decides)."""
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub = tmp_path / "hf" / "hub"
    hub.mkdir(parents=True)
    return hub


# --- 1. built-in, cited geometry --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("geometry", "lm_bytes", "kv_block"),
    [
        (QWEN3_VL_4B, 8_044_936_192, 1152 * MiB),
        (QWEN3_VL_8B, 15_136_811_008, 1152 * MiB),
        (QWEN3_VL_32B, 63_968_421_888, 2 * GiB),
    ],
    ids=["4B", "8B", "32B"],
)
def test_lm_weights_and_kv_block_are_the_audited_numbers(geometry, lm_bytes, kv_block):
    """optimum-rbln 0.12's audit: LM bytes on the device and KV bytes per 8192-token block, exact."""
    assert lm_params(geometry.text)["device"] * 2 == lm_bytes
    assert kv_tensor_count(geometry) * kv_block_bytes_per_tensor(geometry, 8192) == kv_block


@pytest.mark.parametrize(
    ("geometry", "total", "vision"),
    [
        (QWEN3_VL_4B, 4_437_815_808, 415_347_712),
        (QWEN3_VL_8B, 8_767_123_696, 576_388_336),
        (QWEN3_VL_32B, 33_357_390_064, 595_266_800),
    ],
    ids=["4B", "8B", "32B"],
)
def test_parameter_totals_match_the_reference(geometry, total, vision):
    """Unique parameters (tied head once) as transformers 5.15.1 builds them (reference section 5)."""
    lp, vp = lm_params(geometry.text), vision_params(geometry.vision)
    text = (
        lp["layers"]
        + lp["norm"]
        + lp["embed_tokens_host"]
        + (0 if geometry.text.tie_word_embeddings else lp["lm_head"])
    )
    vis = vp["device"] + vp["patch_embed_host"] + vp["pos_embed_host"]
    assert vis == vision
    assert text + vis == total


@pytest.mark.parametrize("size", ["2B", "4B", "8B", "32B"])
@pytest.mark.parametrize("kind", ["Instruct", "Thinking"])
def test_every_dense_hub_id_is_built_in(size, kind, hub_cache):
    geom, _ = load_geometry(f"Qwen/Qwen3-VL-{size}-{kind}")
    assert geom is not None and "built-in" in geom.source
    assert geom.text == modelinfo.DENSE_FAMILY[size].text


def test_an_unknown_hub_id_is_still_refused(hub_cache):
    with pytest.raises(InputError, match="no built-in geometry") as exc:
        load_geometry("Qwen/Qwen3-VL-7B-Instruct")
    assert "HF_HUB_OFFLINE" in exc.value.message
    r = run_qvl("compile", "--preset", "rebel100-1npu", "--model", "acme/Unknown-VL", "--dry-run", env=_env(hub_cache))
    assert r.exit_code == 2 and "acme/Unknown-VL" in r.stderr


# --- 2. the hub id resolves through the local cache --------------------------------------------------------


def _env(hub: Path) -> dict:
    return {"HF_HOME": str(hub.parent), "HF_HUB_CACHE": "", "HF_HUB_OFFLINE": "1"}


def test_cached_config_is_used_for_an_id_without_built_in_numbers(hub_cache):
    snap = make_hub_cache(hub_cache, "acme/Qwen3-VL-8B-Finetune", config_of(QWEN3_VL_8B))
    geom, _ = load_geometry("acme/Qwen3-VL-8B-Finetune")
    assert geom.text == QWEN3_VL_8B.text and geom.vision == QWEN3_VL_8B.vision
    assert geom.snapshot is not None and geom.snapshot.revision == SHA and geom.snapshot.path == snap
    assert SHA in geom.source


def test_cached_config_wins_over_the_built_in_table(hub_cache):
    cfg = config_of(QWEN3_VL_8B)
    cfg["text_config"]["num_hidden_layers"] = 40  # the checkpoint that will be compiled, not the table
    make_hub_cache(hub_cache, "Qwen/Qwen3-VL-8B-Instruct", cfg)
    geom, _ = load_geometry("Qwen/Qwen3-VL-8B-Instruct")
    assert geom.text.num_hidden_layers == 40 and "built-in" not in geom.source


def test_hf_hub_cache_beats_hf_home(tmp_path, hub_cache, monkeypatch):
    other = tmp_path / "elsewhere"
    make_hub_cache(other, "acme/Qwen3-VL-4B-X", config_of(QWEN3_VL_4B))
    with pytest.raises(InputError):
        load_geometry("acme/Qwen3-VL-4B-X")
    monkeypatch.setenv("HF_HUB_CACHE", str(other))
    assert load_geometry("acme/Qwen3-VL-4B-X")[0].text == QWEN3_VL_4B.text


def test_cached_processor_config_gives_the_pixel_caps(hub_cache):
    pre = json.dumps({"size": {"shortest_edge": 4096, "longest_edge": 1048576}})
    make_hub_cache(hub_cache, "acme/Qwen3-VL-8B-Small", config_of(QWEN3_VL_8B), extra={"preprocessor_config.json": pre})
    caps = modelinfo.processor_defaults("acme/Qwen3-VL-8B-Small")
    assert caps["min_pixels"] == 4096 and caps["max_pixels"] == 1048576


def test_dry_run_from_the_cache_records_the_snapshot(hub_cache):
    make_hub_cache(hub_cache, "Qwen/Qwen3-VL-8B-Instruct", config_of(QWEN3_VL_8B))
    r = run_qvl(
        "compile",
        "--preset",
        "rebel100-1npu",
        "--model",
        "Qwen/Qwen3-VL-8B-Instruct",
        "--dry-run",
        "--json",
        env=_env(hub_cache),
    )
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["model_geometry"]["snapshot"]["revision"] == SHA
    assert data["memory"]["verdict"] == "fits"


def test_plan_of_a_cached_id_without_the_network(hub_cache):
    make_hub_cache(hub_cache, "acme/Qwen3-VL-32B-Tuned", config_of(QWEN3_VL_32B))
    plan = build_plan("rebel100-1npu", model="acme/Qwen3-VL-32B-Tuned")
    assert plan.geometry.text.num_hidden_layers == 64


def test_manifest_and_cache_key_record_the_snapshot(hub_cache):
    from qwenvl_rbln.artifacts.cache import cache_key
    from qwenvl_rbln.artifacts.manifest import model_fingerprint

    cfg = config_of(QWEN3_VL_8B)
    a = make_hub_cache(hub_cache, "acme/Qwen3-VL-8B-A", cfg, sha="a" * 40)
    b = make_hub_cache(hub_cache, "acme/Qwen3-VL-8B-B", cfg, sha="b" * 40)
    fa, fb = model_fingerprint("acme/Qwen3-VL-8B-A", a), model_fingerprint("acme/Qwen3-VL-8B-B", b)
    assert fa["snapshot"] == {"repo_id": "acme/Qwen3-VL-8B-A", "revision": "a" * 40}
    assert fa["sha256"] == fb["sha256"]  # same files ...
    plan = build_plan("rebel100-1npu", model="Qwen/Qwen3-VL-8B-Instruct")
    versions = {"optimum-rbln": "0.12.0"}
    assert cache_key(plan, fa, versions)[0] != cache_key(plan, fb, versions)[0]  # ... another snapshot, another key


# --- 3. a preset per model, each with the verdict `fits` ---------------------------------------------------

FAMILY_PRESETS = {
    # preset: (model, batch, context, ViT device, full KV blocks)
    "rebel100-4b": ("Qwen/Qwen3-VL-4B-Instruct", 1, 262144, 0, 32),
    "rebel100-4b-2npu-batch3": ("Qwen/Qwen3-VL-4B-Instruct", 3, 262144, 1, 96),
    "rebel100-8b": ("Qwen/Qwen3-VL-8B-Instruct", 1, 262144, 0, 32),
    "rebel100-8b-2npu-batch3": ("Qwen/Qwen3-VL-8B-Instruct", 3, 262144, 1, 96),
    "rebel100-32b": ("Qwen/Qwen3-VL-32B-Instruct", 1, 40960, 0, 5),
    "rebel100-32b-2npu": ("Qwen/Qwen3-VL-32B-Instruct", 1, 262144, 1, 32),
}


@pytest.mark.parametrize("preset", sorted(FAMILY_PRESETS))
def test_each_family_preset_dry_run_fits(preset, hub_cache):
    model, batch, context, vit_device, blocks = FAMILY_PRESETS[preset]
    r = run_qvl("compile", "--preset", preset, "--dry-run", "--json", env=_env(hub_cache))
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["model_id"] == model and data["memory"]["verdict"] == "fits"
    assert (data["resolved"]["batch_size"], data["resolved"]["max_seq_len"]) == (batch, context)
    assert data["placement"] == {"device": 0, "visual_device": vit_device}
    assert data["memory"]["kv"]["outcome"] == "full" and data["memory"]["kv"]["num_blocks"] == blocks
    assert "trades" in data["description"].lower()


@pytest.mark.parametrize("preset", ["rebel100-4b", "rebel100-8b", "rebel100-32b"])
def test_one_card_presets_are_the_largest_that_fit(preset):
    """A larger context (one more 8192 block) or a larger batch at the same context is not `fits` on one card."""
    _, batch, context, _, _ = FAMILY_PRESETS[preset]
    from qwenvl_rbln.memory.planner import estimate_plan

    def verdict(sets):
        return estimate_plan(build_plan(preset, sets), calibration={}, suggest=False).verdict

    assert verdict([]) == "fits"
    if context < 262144:
        assert verdict([f"max_seq_len={context + 8192}"]) != "fits"
    assert verdict(["batch_size=2", "decoder_batch_sizes=[1,2]"]) != "fits"


@pytest.mark.parametrize("preset", ["rebel100-4b-2npu-batch3", "rebel100-8b-2npu-batch3", "rebel100-32b-2npu"])
def test_the_vit_on_device_1_buys_the_full_context_at_a_larger_batch(preset):
    """One more row at 262144 no longer gets every KV block (or does not fit): the batch is the largest."""
    from qwenvl_rbln.memory.planner import estimate_plan

    _, batch, _, _, _ = FAMILY_PRESETS[preset]
    b = batch + 1
    r = estimate_plan(
        build_plan(preset, [f"batch_size={b}", f"decoder_batch_sizes=[1,{b}]"]), calibration={}, suggest=False
    )
    assert r.verdict != "fits" or r.kv["outcome"] != "full"


# --- 5. nothing assumes the 2B: bucket-plan, load-check and serve on the 8B ---------------------------------


def test_bucket_plan_on_the_8b_uses_its_vit_tower(hub_cache):
    """Depth 27, hidden 1152 from the 8B up: FLOPs, workspace and the verdict come from the 8B's own ViT."""
    from qwenvl_rbln.memory.workspaces import estimate_for_bucket
    from qwenvl_rbln.vision.buckets import vit_cost_fn

    r = run_qvl("bucket-plan", "--preset", "rebel100-8b", "--size", "1920x1080", "--json", env=_env(hub_cache))
    assert r.exit_code == 0, r.stderr
    (bucket,) = json.loads(r.stdout)["summary"]["buckets"]
    assert bucket["flops_per_call"] == vit_cost_fn(QWEN3_VL_8B.vision)(16384)
    assert bucket["flops_per_call"] != vit_cost_fn(modelinfo.QWEN3_VL_2B.vision)(16384)
    assert bucket["workspace_bytes"] == estimate_for_bucket(QWEN3_VL_8B, 16384)["workspace_bytes"]


def test_load_check_and_serve_of_an_8b_artifact_use_its_numbers(tmp_path, capsys, monkeypatch):
    from qwenvl_rbln.artifacts.manifest import write_manifest
    from tests.fakes_rbln import run_main, write_artifact

    monkeypatch.setattr("os.execvpe", lambda *a, **k: (_ for _ in ()).throw(AssertionError("exec")))
    plan = build_plan("rebel100-8b")
    root = write_artifact(tmp_path / "art", plan)
    manifest = {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": plan.model_id}}
    write_manifest(root, {**manifest, "rbln_config": plan.rbln_config})
    code, out, err = run_main(["load-check", str(root), "--no-runtime", "--json"], capsys)
    assert code == 0, err
    items = {i["name"]: i["bytes"] for i in json.loads(out)["memory"]["devices"][0]["items"]}
    assert items["lm.weights"] == 15_136_811_008
    assert items["visual.weights"] == vision_params(QWEN3_VL_8B.vision)["device"] * 2
    assert items["lm.kv_cache"] == 32 * 1152 * MiB
    code, out, err = run_main(["serve", str(root), "--dry-run", "--json"], capsys)
    assert code == 0, err
    argv = json.loads(out)["argv"]
    assert argv[argv.index("--served-model-name") + 1] == "Qwen/Qwen3-VL-8B-Instruct"
    assert argv[argv.index("--max-model-len") + 1] == "262144"


def test_serve_names_the_artifacts_own_model_where_files_are_missing(tmp_path, capsys):
    from qwenvl_rbln.artifacts.manifest import write_manifest
    from tests.fakes_rbln import run_main, write_artifact

    plan = build_plan("rebel100-8b")
    root = write_artifact(tmp_path / "art", plan)
    (root / "processor_config.json").unlink()
    write_manifest(root, {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": plan.model_id}})
    code, out, err = run_main(["serve", str(root), "--dry-run"], capsys)
    assert code == 2 and "(Qwen/Qwen3-VL-8B-Instruct)" in err and "2B" not in err


def test_without_a_cached_copy_a_dry_run_fetches_config_json_alone_when_online(hub_cache, monkeypatch):
    """HF_HUB_OFFLINE unset: huggingface_hub's hf_hub_download is asked for config.json only (a stand-in here:
    tests never touch the network), and the file it leaves in the cache is read."""
    import huggingface_hub

    asked = []

    def fake_download(repo_id, filename, **kwargs):
        asked.append((repo_id, filename))
        snap = make_hub_cache(Path(kwargs["cache_dir"]), repo_id, config_of(QWEN3_VL_8B), sha="f" * 40)
        return str(snap / filename)

    def fake_metadata(url, **kwargs):
        asked.append(("HEAD", url.rsplit("/", 1)[-1], kwargs["retry_on_errors"]))

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE")  # huggingface_hub reads it as offline too
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", fake_metadata)
    geom, warnings = load_geometry("acme/Qwen3-VL-8B-New")
    # one HEAD without retries first, then config.json alone (never weights)
    assert asked == [("HEAD", "config.json", False), ("acme/Qwen3-VL-8B-New", "config.json")]
    assert geom.text == QWEN3_VL_8B.text and geom.snapshot.fetched and geom.snapshot.revision == "f" * 40
    assert any("no weights" in w for w in warnings)


def test_the_32b_single_card_context_claim_is_true():
    """D25: '40960, the most that fits beside the ViT' holds for the base preset's 8192-token partitions (the next
    partition is not a fit), and the smaller-partition figure the description gives fits too."""
    from qwenvl_rbln.memory.planner import estimate_plan

    def verdict(sets: list[str]) -> str:
        return estimate_plan(build_plan("rebel100-32b", sets), calibration={}, suggest=False).verdict

    plan = build_plan("rebel100-32b")
    assert plan.resolved.max_seq_len == 40960 and plan.resolved.kvcache_partition_len == 8192
    assert "the most that fits beside the ViT in the base preset's 8192-token KV partitions" in plan.description
    assert verdict([]) == "fits" and verdict(["max_seq_len=49152"]) != "fits"
    assert "kvcache_partition_len=4096: max_seq_len 53248" in plan.description
    assert verdict(["kvcache_partition_len=4096", "max_seq_len=53248"]) == "fits"
    assert verdict(["kvcache_partition_len=4096", "max_seq_len=57344"]) != "fits"
