"""Model geometry: the numbers every planner needs, read from config.json or built in.

Reading a local config.json is the truth, for any dense Qwen3-VL size. The built-in table exists so
a build host can plan a hub id (no downloads ever) before the weights are on disk, and it holds only
model ids whose config facts are cited below; any other id without a local config.json is refused
(exit 2) rather than planned with another model's numbers.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.paths import user_path

TINY_MODEL_ID = "qvl:tiny"


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

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "text": asdict(self.text), "vision": asdict(self.vision)}


QWEN3_VL_2B = ModelGeometry(
    name="Qwen3-VL-2B",
    text=TextGeometry(2048, 28, 16, 8, 128, 6144, 151936, 262144, True),
    vision=VisionGeometry(depth=24, hidden_size=1024, num_heads=16, intermediate_size=4096, out_hidden_size=2048),
)
# Another Qwen3-VL shape, for tests of the formulas only: its numbers are not cited, so no model id maps to it.
QWEN3_VL_8B = ModelGeometry(
    name="Qwen3-VL-8B",
    text=TextGeometry(4096, 36, 32, 8, 128, 12288, 151936, 262144, False),
    vision=VisionGeometry(depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304, out_hidden_size=4096),
)
# Geometry of the offline tiny model (qvl tiny-model), used when it has not been created yet.
QWEN3_VL_TINY = ModelGeometry(
    name="qvl-tiny",
    text=TextGeometry(64, 3, 4, 2, 16, 128, 512, 8192, True),
    vision=VisionGeometry(depth=3, hidden_size=64, num_heads=4, intermediate_size=128, out_hidden_size=64),
    dtype_bytes=4,
)

# Hub ids (compared case-insensitively) -> built-in geometry, each with the source of its config facts.
# Qwen/Qwen3-VL-2B-Instruct config.json: text hidden 2048, 28 layers, 16 heads, 8 kv heads, head_dim 128,
# intermediate 6144, vocab 151936, max_position_embeddings 262144, tied embeddings; vision depth 24, hidden 1024,
# 16 heads, intermediate 4096, out_hidden 2048, deepstack [5, 11, 17] (shared/reference/optimum-rbln-0.12-qwen3vl.md
# section 6; parameter totals checked against transformers 5.15.1 modules in tests/test_memory.py).
BUILTIN = {"qwen/qwen3-vl-2b-instruct": QWEN3_VL_2B}
BUILTIN_IDS = {"qwen/qwen3-vl-2b-instruct": "Qwen/Qwen3-VL-2B-Instruct"}
MOE_MODEL_TYPE = "qwen3_vl_moe"


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


def tiny_model_dir() -> Path:
    return qvl_home() / "tiny-qwen3-vl"


def resolve_model_path(model: str) -> Path | None:
    """The local directory a model id refers to, or None for a hub id."""
    if model == TINY_MODEL_ID:
        return tiny_model_dir()
    path = user_path(model, "model")
    if path.exists() or model.startswith((".", "/", "~")):
        return path
    return None


def geometry_from_config(cfg: dict[str, Any], name: str, source: str) -> ModelGeometry:
    """Parse a Qwen3-VL config.json (model_type qwen3_vl)."""
    text = cfg.get("text_config") or {}
    vision = cfg.get("vision_config") or {}
    try:
        heads = int(text["num_attention_heads"])
        hidden = int(text["hidden_size"])
        tg = TextGeometry(
            hidden_size=hidden,
            num_hidden_layers=int(text["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(text.get("num_key_value_heads", heads)),
            head_dim=int(text.get("head_dim") or hidden // heads),
            intermediate_size=int(text["intermediate_size"]),
            vocab_size=int(text["vocab_size"]),
            max_position_embeddings=int(text["max_position_embeddings"]),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        )
        vg = VisionGeometry(
            depth=int(vision["depth"]),
            hidden_size=int(vision["hidden_size"]),
            num_heads=int(vision["num_heads"]),
            intermediate_size=int(vision["intermediate_size"]),
            out_hidden_size=int(vision.get("out_hidden_size", hidden)),
            patch_size=int(vision.get("patch_size", 16)),
            spatial_merge_size=int(vision.get("spatial_merge_size", 2)),
            temporal_patch_size=int(vision.get("temporal_patch_size", 2)),
            in_channels=int(vision.get("in_channels", 3)),
            num_position_embeddings=int(vision.get("num_position_embeddings", 2304)),
            num_deepstack=len(vision.get("deepstack_visual_indexes", [5, 11, 17])),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(
            f"{source}: not a Qwen3-VL config (missing or bad {exc})",
            "point --model at a Qwen3-VL model directory (config.json with model_type qwen3_vl)",
        ) from None
    dtype = str(cfg.get("dtype") or cfg.get("torch_dtype") or text.get("dtype") or "bfloat16")
    return ModelGeometry(name=name, text=tg, vision=vg, dtype_bytes=4 if "32" in dtype else 2, source=source)


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
    if isinstance(cfg, dict) and cfg.get("model_type") == MOE_MODEL_TYPE:
        raise InputError(
            f"{cfg_path}: model_type 'qwen3_vl_moe' (Qwen3-VL-MoE): qvl does not count its expert weights, so it "
            "refuses to plan or compile it rather than give a wrong memory verdict",
            "point --model at a dense Qwen3-VL directory (config.json with model_type qwen3_vl, any size)",
        )
    if not isinstance(cfg, dict) or cfg.get("model_type") != "qwen3_vl":
        got = cfg.get("model_type") if isinstance(cfg, dict) else type(cfg).__name__
        raise InputError(
            f"{cfg_path}: model_type is {got!r}, not 'qwen3_vl'",
            "qvl compiles Qwen3-VL models (Qwen3VLForConditionalGeneration); point --model at one",
        )
    return cfg


def load_geometry(model: str, what: str = "--model") -> tuple[ModelGeometry, list[str]]:
    """Geometry for a model id or directory, plus warnings about how it was obtained.

    ``what`` names where the id came from (``--model`` or the preset's ``model`` key) for the refusal.
    """
    path = resolve_model_path(model)
    if model == TINY_MODEL_ID and (path is None or not (path / "config.json").is_file()):
        return replace(QWEN3_VL_TINY, source="built-in (tiny model not created yet)"), []
    if path is not None:
        cfg = read_model_config(path)
        return geometry_from_config(cfg, name=path.name, source=str(path / "config.json")), []
    key = model.strip().lower()
    if key in BUILTIN:
        geom = BUILTIN[key]
        return replace(geom, source=f"built-in numbers for {BUILTIN_IDS[key]} (config facts cited in modelinfo.py)"), []
    ids = ", ".join(BUILTIN_IDS[k] for k in BUILTIN)
    raise InputError(
        f"{what}={model!r}: no local config.json and no built-in geometry for it (built-in, with cited config "
        f"facts: {ids}); qvl does not plan one model with another model's numbers",
        f"pass {'--model' if what == '--model' else 'model: (or --model)'} DIR, a directory holding the model's "
        "config.json (e.g. its downloaded snapshot)",
    )


def processor_defaults(model: str) -> dict[str, int]:
    """Pixel caps from a local preprocessor_config.json when present, else Qwen3-VL's shipped values."""
    caps = {"min_pixels": 65536, "max_pixels": 16777216, "video_min_pixels": 4096, "video_max_pixels": 25165824}
    path = resolve_model_path(model)
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
