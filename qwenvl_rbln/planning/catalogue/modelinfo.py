"""Model geometry: the numbers every planner needs, read from config.json or built in.

Reading a config.json is the truth, for any Qwen3-VL size, dense or MoE (``qwen3_vl_moe``): a local directory's,
or the one in the local Hugging Face cache for a hub id (``hub.py``: the checkpoint that will be compiled). The
built-in table exists so a build host can plan a hub id before the weights are on disk, and it holds only model ids
whose config facts are cited below; any other id with neither a local nor a cached config.json (nor one a dry run
could fetch) is refused (exit 2) rather than planned with another model's numbers.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.paths import user_path
from qwenvl_rbln.planning.catalogue.hub import HubSnapshot, cached_ids, cached_snapshot, fetch_config, is_hub_id

TINY_MODEL_ID = "qvl:tiny"
TINY_MOE_MODEL_ID = "qvl:tiny-moe"
TINY_8B_MODEL_ID = "qvl:tiny-8b"


@dataclass(frozen=True)
class MoEGeometry:
    """The expert fields of a ``qwen3_vl_moe`` text config (Qwen3VLMoeTextConfig); None on a dense model.

    A layer is sparse (router + ``num_experts`` experts) unless it is in ``mlp_only_layers`` or
    ``(layer + 1) % decoder_sparse_step != 0``; then it keeps a dense MLP of ``intermediate_size``
    (transformers' ``Qwen3VLMoeTextDecoderLayer``, which optimum-rbln 0.12's ``Qwen3VLMoeLayer`` follows).
    """

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def is_sparse(self, layer: int) -> bool:
        step = self.decoder_sparse_step
        return layer not in self.mlp_only_layers and self.num_experts > 0 and (layer + 1) % step == 0

    def sparse_layers(self, num_layers: int) -> int:
        return sum(1 for i in range(num_layers) if self.is_sparse(i))


@dataclass(frozen=True)
class TextGeometry:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    moe: MoEGeometry | None = None


@dataclass(frozen=True)
class VisionGeometry:
    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    in_channels: int = 3
    num_position_embeddings: int = 2304
    num_deepstack: int = 3


@dataclass(frozen=True)
class ModelGeometry:
    name: str
    text: TextGeometry
    vision: VisionGeometry
    dtype_bytes: int = 2  # bf16 on the NPU
    source: str = "built-in"
    snapshot: HubSnapshot | None = None  # the Hugging Face cache snapshot config.json was read from, if any

    def to_dict(self) -> dict[str, Any]:
        text = asdict(self.text)
        if text.get("moe") is None:
            text.pop("moe", None)  # a dense model's text geometry reads as before
        out = {"name": self.name, "source": self.source, "text": text, "vision": asdict(self.vision)}
        if self.snapshot is not None:
            out["snapshot"] = self.snapshot.to_dict()
        return out


# Config facts of the dense Qwen3-VL family, from shared/reference/qwen3-vl-family.md (sections 1, 3, 7), each
# seen in at least two independent copies of the model's config.json:
# - every size: head_dim 128, vocab 151936, max_position_embeddings 262144; vision 16 heads, patch 16, merge 2,
#   temporal patch 2, 2304 position embeddings, 3 deepstack mergers; out_hidden_size = the text hidden size.
# - 2B  text 2048 / 28 layers / 16 q / 8 kv heads / intermediate 6144, tied; vision depth 24, hidden 1024,
#   intermediate 4096, deepstack [5, 11, 17] ([TT] torchtitan qwen3_vl, [XI] xorbitsai/inference#4592; also
#   shared/reference/optimum-rbln-0.12-qwen3vl.md section 6).
# - 4B  text 2560 / 36 / 32 / 8 / 9728, tied; vision as the 2B ([SE4] swedishembedded/brain qwen3vl config.rs,
#   [DS] a verbatim 4B config.json copy).
# - 8B  text 4096 / 36 / 32 / 8 / 12288, untied; vision depth 27, hidden 1152, intermediate 4304, deepstack
#   [8, 16, 24] ([TT], [XT] InternLM/xtuner qwen3_vl_config.py, [BL]); untied is also what the published 8.77B
#   parameter total requires.
# - 32B text 5120 / 64 / 64 / 8 / 25600, untied; vision as the 8B ([IT] a block-level check against the 32B
#   config.json, [MX] MiniMax-H3's SHIPPED_CONFIG test).
# - -Thinking: the same architecture as -Instruct (same classes, parameter totals and GQA in every listing that
#   gives both, reference section 7); only the chat template and generation config differ.
# Parameter totals and the LM bytes the optimum-rbln 0.12 audit found (4B 8,044,936,192 B, 8B 15,136,811,008 B,
# 32B 63,968,421,888 B) are pinned by tests/test_family.py.
_VIT_SMALL = dict(depth=24, hidden_size=1024, num_heads=16, intermediate_size=4096)
_VIT_LARGE = dict(depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304)
QWEN3_VL_2B = ModelGeometry(
    name="Qwen3-VL-2B",
    text=TextGeometry(2048, 28, 16, 8, 128, 6144, 151936, 262144, True),
    vision=VisionGeometry(**_VIT_SMALL, out_hidden_size=2048),
)
QWEN3_VL_4B = ModelGeometry(
    name="Qwen3-VL-4B",
    text=TextGeometry(2560, 36, 32, 8, 128, 9728, 151936, 262144, True),
    vision=VisionGeometry(**_VIT_SMALL, out_hidden_size=2560),
)
QWEN3_VL_8B = ModelGeometry(
    name="Qwen3-VL-8B",
    text=TextGeometry(4096, 36, 32, 8, 128, 12288, 151936, 262144, False),
    vision=VisionGeometry(**_VIT_LARGE, out_hidden_size=4096),
)
QWEN3_VL_32B = ModelGeometry(
    name="Qwen3-VL-32B",
    text=TextGeometry(5120, 64, 64, 8, 128, 25600, 151936, 262144, False),
    vision=VisionGeometry(**_VIT_LARGE, out_hidden_size=5120),
)
# Geometry of the offline tiny model (qvl tiny-model), used when it has not been created yet.
QWEN3_VL_TINY = ModelGeometry(
    name="qvl-tiny",
    text=TextGeometry(64, 3, 4, 2, 16, 128, 512, 8192, True),
    vision=VisionGeometry(depth=3, hidden_size=64, num_heads=4, intermediate_size=128, out_hidden_size=64),
    dtype_bytes=4,
)
# The offline tiny Qwen3-VL-MoE (qvl tiny-model --moe; backends/tiny/moe.py): the tiny dims plus 4 experts, top 2.
QWEN3_VL_TINY_MOE = replace(
    QWEN3_VL_TINY,
    name="qvl-tiny-moe",
    text=replace(QWEN3_VL_TINY.text, moe=MoEGeometry(4, 2, 32, 1, (1,))),
)
# The offline tiny model shaped like the 8B/32B (qvl tiny-model --shape 8b; backends/tiny/untied.py): an untied
# lm_head and a ViT narrower than the text (hidden 48, out_hidden_size = the text hidden 64), depth 4 with deepstack
# [1, 2, 3] (the 8B's [8, 16, 24] of 27 scaled to depth 4).
QWEN3_VL_TINY_8B = replace(
    QWEN3_VL_TINY,
    name="qvl-tiny-8b",
    text=replace(QWEN3_VL_TINY.text, tie_word_embeddings=False),
    vision=VisionGeometry(depth=4, hidden_size=48, num_heads=4, intermediate_size=96, out_hidden_size=64),
)
# The tiny model ids: id -> (the tiny-model variant, its directory name under QVL_HOME, its built-in geometry).
TINY_MODELS: dict[str, tuple[str, str, ModelGeometry]] = {
    TINY_MODEL_ID: ("2b", "tiny-qwen3-vl", QWEN3_VL_TINY),
    TINY_MOE_MODEL_ID: ("moe", "tiny-qwen3-vl-moe", QWEN3_VL_TINY_MOE),
    TINY_8B_MODEL_ID: ("8b", "tiny-qwen3-vl-8b", QWEN3_VL_TINY_8B),
}
# Qwen3-VL-MoE (model_type qwen3_vl_moe), from shared/reference/qwen3-vl-family.md sections 1-3: text head_dim 128,
# vocab 151936, max_position_embeddings 262144, untied head; every layer sparse (decoder_sparse_step 1,
# mlp_only_layers []), 128 experts, top 8; vision depth 27, hidden 1152, 16 heads, intermediate 4304,
# deepstack [8, 16, 24], out_hidden_size = the text hidden size. 30B-A3B: hidden 2048, 48 layers, 32 q / 4 KV heads,
# moe_intermediate_size 768 (its config.json transcribed verbatim in [SE30], also [TT] [XT] [SL]). 235B-A22B: hidden
# 4096, 94 layers, 64 q / 4 KV heads, moe_intermediate_size 1536 ([TT] [XT] [SL]). The unused dense
# intermediate_size (6144 / 12288) is kept as the config carries it. Totals checked against transformers 5.15.1's
# Qwen3VLMoeForConditionalGeneration on the meta device in tests/test_moe_memory.py.
_MOE_VISION = VisionGeometry(depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304, out_hidden_size=2048)
QWEN3_VL_30B_A3B = ModelGeometry(
    name="Qwen3-VL-30B-A3B",
    text=TextGeometry(2048, 48, 32, 4, 128, 6144, 151936, 262144, False, MoEGeometry(128, 8, 768)),
    vision=_MOE_VISION,
)
QWEN3_VL_235B_A22B = ModelGeometry(
    name="Qwen3-VL-235B-A22B",
    text=TextGeometry(4096, 94, 64, 4, 128, 12288, 151936, 262144, False, MoEGeometry(128, 8, 1536)),
    vision=replace(_MOE_VISION, out_hidden_size=4096),
)

# Hub ids (compared case-insensitively) -> built-in geometry (sources above).
DENSE_FAMILY = {"2B": QWEN3_VL_2B, "4B": QWEN3_VL_4B, "8B": QWEN3_VL_8B, "32B": QWEN3_VL_32B}
MOE_FAMILY = {"30B-A3B": QWEN3_VL_30B_A3B, "235B-A22B": QWEN3_VL_235B_A22B}
# Instruct and Thinking share the architecture (qwen3-vl-family.md section 7).
_FAMILY = {**DENSE_FAMILY, **MOE_FAMILY}
BUILTIN_IDS = {
    f"qwen/qwen3-vl-{size.lower()}-{kind.lower()}": f"Qwen/Qwen3-VL-{size}-{kind}"
    for size in _FAMILY
    for kind in ("Instruct", "Thinking")
}
BUILTIN = {
    f"qwen/qwen3-vl-{size.lower()}-{kind.lower()}": geom
    for size, geom in _FAMILY.items()
    for kind in ("Instruct", "Thinking")
}
MOE_MODEL_TYPE = "qwen3_vl_moe"
MODEL_TYPES = ("qwen3_vl", MOE_MODEL_TYPE)


def qvl_home() -> Path:
    """``$QVL_HOME`` (default ``~/.cache/qvl``); InputError naming it when it, or a folder above it, is a file."""
    home = os.environ.get("QVL_HOME")
    path = user_path(home, "QVL_HOME") if home else Path.home() / ".cache" / "qvl"
    blocker = next((p for p in [path, *path.parents] if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        where = "is a file" if blocker == path else f"lies below {blocker}, which is a file"
        raise InputError(
            f"QVL_HOME={str(path)!r} {where}, not a directory" if home else f"{path} {where}, not a directory",
            "set QVL_HOME to a directory (qvl keeps its locks, compile cache and tiny model there)"
            if home
            else "move that file away, or set QVL_HOME to a directory",
        )
    return path


def tiny_model_dir(moe: bool = False, shape: str = "2b") -> Path:
    """Where the shared copy of one tiny-model variant lives (dense 2B-shaped, MoE, or ``shape`` "8b")."""
    variant = "moe" if moe else shape
    return qvl_home() / next(d for v, d, _ in TINY_MODELS.values() if v == variant)


def tiny_variant(model: str) -> dict[str, Any] | None:
    """The ``ensure_tiny_model`` keywords (moe, shape) of a tiny model id, or None for any other model."""
    if model not in TINY_MODELS:
        return None
    variant = TINY_MODELS[model][0]
    return {"moe": True} if variant == "moe" else {"shape": variant}


def resolve_model_path(model: str) -> Path | None:
    """The local directory a model id refers to, or None for a hub id."""
    variant = tiny_variant(model)
    if variant is not None:
        return tiny_model_dir(**variant)
    path = user_path(model, "model")
    if path.exists() or model.startswith((".", "/", "~")):
        return path
    return None


_REQUIRED = object()


class _Counts:
    """Reads the counts of one config.json section, each a positive integer (a layer, head or size count): a
    corrupt value (-4, 0, 36.5, "x") is refused naming the file, key and value, never planned as negative memory."""

    def __init__(self, section: dict[str, Any], prefix: str, source: str):
        self.section, self.prefix, self.source = section, prefix, source

    def __call__(self, key: str, default: Any = _REQUIRED, *, minimum: int = 1) -> int:
        value = self.section.get(key) if default is not _REQUIRED else self.section[key]
        if value is None and default is not _REQUIRED:
            value = default
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if type(value) is not int or value < minimum:
            what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise InputError(
                f"{self.source}: {self.prefix}{key}={value!r} is not {what}",
                f"fix {self.prefix}{key} in that config.json (a count the model's shapes are built from), or "
                "re-download the model",
            )
        return value


def moe_from_text_config(text: dict[str, Any], source: str = "config.json") -> MoEGeometry:
    """The expert fields of a ``qwen3_vl_moe`` text config; KeyError names a missing one (never counted as dense).

    transformers 5 saves ``num_experts`` as ``num_local_experts`` (an attribute alias); both are read.
    """
    count = _Counts(text, "text_config.", source)
    key = "num_experts" if text.get("num_experts") is not None else "num_local_experts"
    if text.get(key) is None:
        raise KeyError("text_config.num_experts")
    experts = count(key)
    top_k = count("num_experts_per_tok")
    if top_k > experts:
        raise InputError(
            f"{source}: text_config.num_experts_per_tok={top_k} is more than its {experts} experts",
            "fix num_experts_per_tok in that config.json, or re-download the model",
        )
    layers = text.get("mlp_only_layers") or []
    if not isinstance(layers, list) or not all(type(i) is int and i >= 0 for i in layers):
        raise InputError(
            f"{source}: text_config.mlp_only_layers={layers!r} is not a list of layer indexes",
            "fix mlp_only_layers in that config.json (e.g. [] or [0, 5]), or re-download the model",
        )
    return MoEGeometry(
        num_experts=experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=count("moe_intermediate_size"),
        decoder_sparse_step=count("decoder_sparse_step", 1),
        mlp_only_layers=tuple(layers),
    )


def geometry_from_config(cfg: dict[str, Any], name: str, source: str) -> ModelGeometry:
    """Parse a Qwen3-VL config.json (model_type qwen3_vl, or qwen3_vl_moe with its expert fields)."""
    text = cfg.get("text_config") or {}
    vision = cfg.get("vision_config") or {}
    try:
        t, v = _Counts(text, "text_config.", source), _Counts(vision, "vision_config.", source)
        heads, hidden = t("num_attention_heads"), t("hidden_size")
        tg = TextGeometry(
            hidden_size=hidden,
            num_hidden_layers=t("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=t("num_key_value_heads", heads),
            head_dim=t("head_dim", hidden // heads),
            intermediate_size=t("intermediate_size"),
            vocab_size=t("vocab_size"),
            max_position_embeddings=t("max_position_embeddings"),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            moe=moe_from_text_config(text, source) if cfg.get("model_type") == MOE_MODEL_TYPE else None,
        )
        deepstack = vision.get("deepstack_visual_indexes", [5, 11, 17])
        vg = VisionGeometry(
            depth=v("depth"),
            hidden_size=v("hidden_size"),
            num_heads=v("num_heads"),
            intermediate_size=v("intermediate_size"),
            out_hidden_size=v("out_hidden_size", hidden),
            patch_size=v("patch_size", 16),
            spatial_merge_size=v("spatial_merge_size", 2),
            temporal_patch_size=v("temporal_patch_size", 2),
            in_channels=v("in_channels", 3),
            num_position_embeddings=v("num_position_embeddings", 2304),
            num_deepstack=len(deepstack),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(
            f"{source}: not a Qwen3-VL config (missing or bad {exc})",
            "point --model at a Qwen3-VL model directory (config.json with model_type qwen3_vl)",
        ) from None
    dtype = str(cfg.get("dtype") or cfg.get("torch_dtype") or text.get("dtype") or "bfloat16")
    return ModelGeometry(name=name, text=tg, vision=vg, dtype_bytes=4 if "32" in dtype else 2, source=source)


def moe_summary(geometry: ModelGeometry) -> str | None:
    """The numbers in which a Qwen3-VL-MoE differs from the dense models, in one line (None for a dense model):
    bucket-plan, load-check and serve print it, because its ViT (depth 27, hidden 1152) and ``out_hidden_size``
    are not the 2B's."""
    t, v, m = geometry.text, geometry.vision, geometry.text.moe
    if m is None:
        return None
    sparse = m.sparse_layers(t.num_hidden_layers)
    return (
        f"{geometry.name}: Qwen3-VL-MoE, {t.num_hidden_layers} layers ({sparse} with {m.num_experts} experts, top "
        f"{m.num_experts_per_tok}, moe_intermediate_size {m.moe_intermediate_size}), hidden {t.hidden_size}, "
        f"{t.num_attention_heads} q / {t.num_key_value_heads} KV heads; ViT depth {v.depth}, hidden {v.hidden_size}, "
        f"out_hidden_size {v.out_hidden_size}"
    )


def read_model_config(path: Path) -> dict[str, Any]:
    cfg_path = path / "config.json"
    if not path.is_dir():
        raise InputError(f"model directory {path} does not exist", "pass a local Qwen3-VL directory or a hub id")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path} has no config.json", "point --model at a Hugging Face model directory") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{cfg_path}: unreadable config.json ({exc})", "re-download or re-save the model") from None
    if not isinstance(cfg, dict) or cfg.get("model_type") not in MODEL_TYPES:
        got = cfg.get("model_type") if isinstance(cfg, dict) else type(cfg).__name__
        raise InputError(
            f"{cfg_path}: model_type is {got!r}, not 'qwen3_vl' or 'qwen3_vl_moe'",
            "qvl compiles Qwen3-VL models (Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration); "
            "point --model at one",
        )
    return cfg


def load_geometry(model: str, what: str = "--model") -> tuple[ModelGeometry, list[str]]:
    """Geometry for a model id or directory, plus warnings about how it was obtained.

    A hub id reads, in order: its config.json in the local Hugging Face cache (the checkpoint that will be
    compiled), the built-in table, config.json alone fetched from the hub (only when HF_HUB_OFFLINE is unset).
    ``what`` names where the id came from (``--model`` or the preset's ``model`` key) for the refusal.
    """
    path = resolve_model_path(model)
    if model in TINY_MODELS and (path is None or not (path / "config.json").is_file()):
        return replace(TINY_MODELS[model][2], source="built-in (tiny model not created yet)"), []
    if path is not None:
        cfg = read_model_config(path)
        return geometry_from_config(cfg, name=path.name, source=str(path / "config.json")), []
    snap = cached_snapshot(model)
    if snap is not None:
        return _from_snapshot(snap, "the local Hugging Face cache"), []
    key = model.strip().lower()
    if key in BUILTIN:
        geom = BUILTIN[key]
        return replace(geom, source=f"built-in numbers for {BUILTIN_IDS[key]} (config facts cited in modelinfo.py)"), []
    why = "not a hub id"
    if is_hub_id(model):
        snap, why = fetch_config(model)
        if snap is not None:
            geom = _from_snapshot(snap, "the hub (config.json alone, no weights)")
            return geom, [f"{model}: config.json fetched from the hub into the local cache (no weights)"]
    raise _unknown_model(model, what, why)


def _unknown_model(model: str, what: str, why: str) -> InputError:
    """The refusal of an id qvl has no numbers for: 'did you mean' the nearest built-in or cached id (a typo is
    never handed back as an `hf download` command), and a trailing slash named."""
    flag = "--model" if what == "--model" else "model: (or --model)"
    ids = list(dict.fromkeys(BUILTIN_IDS[k] for k in BUILTIN))
    stripped = model.strip().rstrip("/")
    known = {i.lower(): i for i in [*ids, *cached_ids()]}
    near = difflib.get_close_matches(stripped.lower(), list(known), n=1, cutoff=0.8)
    slash = " (a hub id is ORG/NAME, without a trailing slash)" if model.rstrip() != stripped else ""
    message = (
        f"{what}={model!r}{slash}: no local config.json, none in the Hugging Face cache ({why}) and no built-in "
        f"geometry for it (built-in, with cited config facts: {', '.join(ids)}); qvl does not plan one model with "
        "another model's numbers"
    )
    if near:
        return InputError(
            message,
            f"did you mean {flag} {known[near[0]]}? Otherwise pass {flag} DIR, a directory holding its config.json",
        )
    fetch = f"`hf download {stripped} config.json`" if is_hub_id(stripped) else "`hf download ORG/NAME config.json`"
    return InputError(
        message,
        f"pass {flag} DIR, a directory holding the model's config.json, or put it in the cache first ({fetch})",
    )


def _from_snapshot(snap: HubSnapshot, where: str) -> ModelGeometry:
    cfg = read_model_config(snap.path)
    geom = geometry_from_config(cfg, name=snap.repo_id.split("/")[-1], source=str(snap.path / "config.json"))
    source = f"{snap.path / 'config.json'} ({where}: {snap.repo_id} snapshot {snap.revision})"
    return replace(geom, source=source, snapshot=snap)


def model_directory(model: str) -> Path | None:
    """The local directory a model's files are read from: a local path, or a hub id's cached snapshot."""
    path = resolve_model_path(model)
    if path is not None:
        return path
    snap = cached_snapshot(model)
    return snap.path if snap is not None else None


def processor_defaults(model: str) -> dict[str, int]:
    """Pixel caps from a local preprocessor_config.json when present, else Qwen3-VL's shipped values."""
    caps = {"min_pixels": 65536, "max_pixels": 16777216, "video_min_pixels": 4096, "video_max_pixels": 25165824}
    path = model_directory(model)
    if path is None:
        return caps
    for fname, lo, hi in (
        ("preprocessor_config.json", "min_pixels", "max_pixels"),
        ("video_preprocessor_config.json", "video_min_pixels", "video_max_pixels"),
    ):
        try:
            data = json.loads((path / fname).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        size = data.get("size") or {}
        if isinstance(size, dict):
            caps[lo] = int(size.get("shortest_edge", data.get("min_pixels", caps[lo])))
            caps[hi] = int(size.get("longest_edge", data.get("max_pixels", caps[hi])))
    return caps


def min_pixels_bucket(min_pixels: int, patch_size: int = 16, merge_size: int = 2) -> int:
    """The smallest largest-ViT-bucket (patches) that holds an image of ``min_pixels``: the processor never resizes
    below min_pixels, so a lower bucket leaves no image that fits. Whole merge groups (2x2 patches). The one floor
    the plan's refusal and tune's bucket choice both use."""
    need = -(-min_pixels // patch_size**2)
    return need + -need % (merge_size**2)
