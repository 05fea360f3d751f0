"""An artifact's layout: its kind and config, the target it was compiled for, its graphs, and the files it must hold.

Layout of an optimum-rbln 0.12.0 Qwen3-VL artifact (what ``save_pretrained`` writes; see
``optimum/rbln/modeling.py:143-221`` and ``transformers/models/qwen3_vl/modeling_qwen3_vl.py:92-103``)::

    rbln_config.json  config.json  generation_config.json  torch_artifacts.pth
    prefill.rbln  decoder_batch_<N>.rbln (one per decoder_batch_sizes entry)
    <tokenizer and processor files>
    visual/compiled_model.rbln  visual/rbln_config.json  visual/config.json  visual/torch_artifacts.pth

The torch backend writes a copy of the Hugging Face model plus ``qvl-rbln-config.json`` (same shape as
rbln_config.json) and the manifest. Reading an artifact back, as every loader does, is this module's one job.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qwenvl_rbln.artifacts.manifest import (
    MANIFEST_NAME,
    RBLN_CONFIG_NAME,
    TORCH_CONFIG_NAME,
    unsafe_relpath,
    verify_manifest,
)
from qwenvl_rbln.artifacts.processor_files import Reader
from qwenvl_rbln.errors import InputError
from qwenvl_rbln.paths import user_path
from qwenvl_rbln.planning.lm.resolved import ResolvedLM

EXPECTED_OPTIMUM_RBLN = "0.12.0"
QWEN3_VL_CONFIG_CLS = "RBLNQwen3VLForConditionalGenerationConfig"
# Qwen3-VL-MoE (optimum-rbln 0.12: a subclass of the dense config, reached from model_type qwen3_vl_moe)
QWEN3_VL_MOE_CONFIG_CLS = "RBLNQwen3VLMoeForConditionalGenerationConfig"
QWEN3_VL_CONFIG_CLSES = (QWEN3_VL_CONFIG_CLS, QWEN3_VL_MOE_CONFIG_CLS)

# A file of the processor and one of the tokenizer must be present (transformers 5 saves
# processor_config.json; the Qwen hub repos ship preprocessor_config.json).
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def artifact_kind(artifact_dir: Path) -> str | None:
    artifact_dir = Path(artifact_dir)
    if (artifact_dir / RBLN_CONFIG_NAME).is_file():
        return "rbln"
    if (artifact_dir / TORCH_CONFIG_NAME).is_file():
        return "torch"
    return None


def read_json(path: Path) -> dict[str, Any]:
    try:
        raw: bytes | OSError = Path(path).read_bytes()
    except OSError as exc:
        raw = exc
    return json_object(path, raw)


def json_text(raw: bytes) -> str:
    """``raw`` as ``Path.read_text(encoding="utf-8")`` gives it: UTF-8, universal newlines."""
    return raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


def json_object(path: Path, raw: bytes | OSError) -> dict[str, Any]:
    """``read_json``'s object and refusals from bytes already read (or the error reading them raised), so a file
    read once for its hash is parsed from the same bytes."""
    try:
        if isinstance(raw, OSError):
            raise raw
        data = json.loads(json_text(raw))
    except FileNotFoundError:
        raise InputError(f"{path} does not exist", "point at a directory written by `qvl compile`") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc})", "recompile the artifact (`qvl compile --force`)") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(data).__name__}", "recompile the artifact")
    return data


def locate_artifact(artifact_dir: Path) -> tuple[Path, str]:
    """(directory, kind) of a compiled artifact, or the one-line refusal of a path that is not one."""
    artifact_dir = user_path(artifact_dir)
    if not artifact_dir.is_dir():
        what = "is a file, not a directory" if artifact_dir.exists() else "does not exist"
        raise InputError(
            f"artifact directory {artifact_dir} {what}",
            "compile first (`qvl compile --preset P -o DIR`) or pass the directory it wrote",
        )
    kind = artifact_kind(artifact_dir)
    if kind is None:
        raise InputError(
            f"{artifact_dir} is not a compiled artifact (no {RBLN_CONFIG_NAME} or {TORCH_CONFIG_NAME})",
            "pass the directory `qvl compile` wrote (-o), or compile into it first",
        )
    return artifact_dir, kind


def config_name(kind: str) -> str:
    """The config file of an artifact of ``kind``: rbln_config.json, or the torch backend's copy of it."""
    return RBLN_CONFIG_NAME if kind == "rbln" else TORCH_CONFIG_NAME


def refuse_old_format(path: Path, cfg: dict[str, Any]) -> None:
    if "_meta" in cfg:
        raise InputError(
            f"{path} is an old-format rbln_config.json (has _meta)",
            "recompile with optimum-rbln 0.12.0 (`qvl compile --force`)",
        )


def read_artifact_config(artifact_dir: Path) -> tuple[str, dict[str, Any]]:
    """(kind, config): rbln_config.json of an optimum-rbln artifact, or qvl-rbln-config.json of a torch one."""
    artifact_dir, kind = locate_artifact(artifact_dir)
    path = artifact_dir / config_name(kind)
    cfg = read_json(path)
    refuse_old_format(path, cfg)
    return kind, cfg


def _compile_cfgs(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    items = cfg.get("_compile_cfgs") or []
    return [c for c in items if isinstance(c, dict)]


def compile_target(cfg: dict[str, Any], manifest: dict[str, Any] | None = None) -> dict[str, Any]:
    """Target NPU and num_devices as compiled, read from ``_compile_cfgs`` (top-level npu is never saved)."""

    def one(section: dict[str, Any]) -> tuple[str | None, int | None, list[str]]:
        cfgs = _compile_cfgs(section)
        npus = sorted({c.get("npu") for c in cfgs if isinstance(c.get("npu"), str) and c.get("npu")})
        odd = [
            c.get("npu") for c in cfgs if c.get("npu") is not None and not (isinstance(c.get("npu"), str) and c["npu"])
        ]
        nds = sorted({c["num_devices"] for c in cfgs if type(c.get("num_devices")) is int and c["num_devices"] > 0})
        problems = []
        if len(npus) > 1:
            problems.append(f"graphs were compiled for different NPUs {npus}")
        if odd:
            problems.append(f"_compile_cfgs names an NPU that is not an SKU string ({odd[0]!r})")
        if len(nds) > 1:
            problems.append(f"graphs were compiled for different num_devices {nds}")
        return (npus[0] if npus else None), (nds[0] if nds else None), problems

    npu, nd, problems = one(cfg)
    visual = cfg.get("visual") if isinstance(cfg.get("visual"), dict) else {}
    vnpu, vnd, vproblems = one(visual)
    notes = []
    source = "_compile_cfgs"
    if npu is None and manifest and manifest.get("npu"):
        npu, source = manifest["npu"], "qvl-manifest.json (rbln_config.json has no npu in _compile_cfgs)"
    elif npu is None:
        notes.append("the artifact does not record its target NPU (compiled without an explicit npu)")
    return {
        "npu": npu,
        "num_devices": nd or 1,
        "visual_npu": vnpu or npu,
        "visual_num_devices": vnd or nd or 1,
        "source": source,
        "problems": problems + [f"visual: {p}" for p in vproblems],
        "notes": notes,
    }


def expected_graph_names(cfg: dict[str, Any]) -> list[str]:
    """optimum-rbln's ``expected_compiled_model_names`` (configuration_decoderonly.py:337-345)."""
    phases = cfg.get("phases") or ["prefill", "decode"]
    batch = cfg.get("batch_size") or 1
    dbs = cfg.get("decoder_batch_sizes") or [batch]
    if "decode" in phases:
        return list(phases[: phases.index("decode")]) + [f"decoder_batch_{b}" for b in dbs]
    return list(phases)


def resolved_from_rbln_config(cfg: dict[str, Any], *, source: str = RBLN_CONFIG_NAME) -> ResolvedLM:
    """ResolvedLM of a compiled rbln_config.json, for the NPU and num_devices it was compiled for."""
    return ResolvedLM.from_rbln_config(cfg, compile_target(cfg), source=source)


def placement_from_artifact(cfg: dict[str, Any], manifest: dict[str, Any] | None) -> dict[str, Any]:
    """The placement an artifact was planned for: qvl-manifest.json's, else device 0 (or 0..n-1) for both.

    rbln_config.json never stores devices (runtime options are not saved), so without a manifest this is the
    optimum-rbln default: every submodule on ``[0 .. num_devices-1]``.
    """
    if manifest and isinstance(manifest.get("placement"), dict) and "device" in manifest["placement"]:
        placement = manifest["placement"]
        return {
            "device": placement["device"],
            "visual_device": placement.get("visual_device", placement["device"]),
            "source": MANIFEST_NAME,
        }
    target = compile_target(cfg)

    def default(n: int) -> int | list[int]:
        return 0 if n <= 1 else list(range(n))

    return {
        "device": default(target["num_devices"]),
        "visual_device": default(target["visual_num_devices"]),
        "source": "optimum-rbln default (no qvl-manifest.json)",
    }


def unsafe_graph_names(cfg: dict[str, Any]) -> list[str]:
    """compiled_model_name values that are not plain file names (they would point outside the artifact)."""
    visual = cfg.get("visual") if isinstance(cfg.get("visual"), dict) else {}
    names = [c.get("compiled_model_name") for c in [*_compile_cfgs(cfg), *_compile_cfgs(visual)]]
    return [str(n) for n in names if n and (not isinstance(n, str) or unsafe_relpath(n) or "/" in n)]


def graph_files(cfg: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Compiled graph -> {"file": relative path, "submodule": "lm"|"visual"}, as optimum-rbln loads them.

    Graph names that are not plain file names are left out (``check_layout`` reports them)."""
    bad = set(unsafe_graph_names(cfg))
    names = [c.get("compiled_model_name") for c in _compile_cfgs(cfg) if c.get("compiled_model_name")]
    names = [n for n in names if str(n) not in bad] or [n for n in expected_graph_names(cfg) if str(n) not in bad]
    out = {name: {"file": f"{name}.rbln", "submodule": "lm"} for name in names}
    visual = cfg.get("visual") if isinstance(cfg.get("visual"), dict) else {}
    vnames = [c.get("compiled_model_name") for c in _compile_cfgs(visual) if c.get("compiled_model_name")]
    for name in [n for n in vnames if str(n) not in bad] or ["compiled_model"]:
        out[f"visual/{name}"] = {"file": f"visual/{name}.rbln", "submodule": "visual"}
    return out


def _group_missing(root: Path, group: tuple[str, ...]) -> str | None:
    return None if any((root / name).is_file() for name in group) else " or ".join(group)


def _torch_weight_files(root: Path) -> tuple[list[str], list[str]]:
    """(missing, present) weight files of a Hugging Face directory (shards listed by an index must exist)."""
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (root / index).is_file():
            try:
                data = json.loads((root / index).read_text(encoding="utf-8"))
                weight_map = (data.get("weight_map") if isinstance(data, dict) else None) or {}
                shards = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else None
            except (OSError, ValueError, TypeError):
                shards = None
            if shards is None or not all(isinstance(x, str) and not unsafe_relpath(x) for x in shards):
                return [f"{index} (unreadable, or a shard path outside the artifact)"], []
            return [s for s in shards if not (root / s).is_file()], [index, *shards]
    for single in ("model.safetensors", "pytorch_model.bin"):
        if (root / single).is_file():
            return [], [single]
    return ["model.safetensors (or sharded weights with an index)"], []


def vit_buckets_and_patch(
    root: Path, cfg: dict[str, Any], *, read: Reader | None = None
) -> tuple[list[int], int] | None:
    """The compiled ViT buckets (rbln_config.json) and the patch size (config.json, 16 when absent); None when the
    config has no valid bucket list (the config check reports it). ``read``: the artifact's files as already read
    (``CheckedArtifact.read``), else from disk."""
    visual = cfg.get("visual") if isinstance(cfg.get("visual"), dict) else {}
    buckets = visual.get("max_seq_len")
    buckets = [buckets] if isinstance(buckets, int) else buckets
    if not (isinstance(buckets, list) and buckets and all(type(b) is int and b > 0 for b in buckets)):
        return None
    model = read("config.json") if read is not None else read_json_quiet(root / "config.json")
    vision = (model or {}).get("vision_config") or {}
    patch = vision.get("patch_size", 16) if isinstance(vision, dict) else 16
    return buckets, patch if type(patch) is int and patch > 0 else 16


def processor_problems(
    root: Path, cfg: dict[str, Any], manifest: dict[str, Any] | None, *, read: Reader | None = None
) -> list[str]:
    """The processor files against the compiled ViT buckets and the recorded caps (``processor_files.check``)."""
    from qwenvl_rbln.artifacts.processor_files import check

    found = vit_buckets_and_patch(root, cfg, read=read)
    if found is None:
        return []  # the config check reports a broken bucket list
    return check(root, found[0], found[1], (manifest or {}).get("processor"), read=read)


def read_json_quiet(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def check_layout(
    artifact_dir: Path,
    kind: str,
    cfg: dict[str, Any],
    manifest: dict[str, Any] | None,
    *,
    processor: bool = True,
    read: Reader | None = None,
    known: dict[str, tuple[int, str]] | None = None,
) -> dict:
    """Files the loader needs, checked against the artifact's own config; manifest hashes when present.
    ``processor=False``: the processor caps are left to the caller (load-check reports them as warnings). ``read``
    and ``known``: the files a ``CheckedArtifact`` read already (parsed, and their size and sha256), not read
    again."""
    root = Path(artifact_dir)
    missing: list[str] = []
    unexpected: list[str] = []
    problems: list[str] = []
    notes: list[str] = []
    expected: list[str] = []

    def need(rel: str) -> None:
        expected.append(rel)
        if not (root / rel).is_file():
            missing.append(rel)

    def need_group(group: tuple[str, ...]) -> None:
        expected.append(" or ".join(group))
        gap = _group_missing(root, group)
        if gap:
            missing.append(gap)

    if kind == "rbln":
        cls_name = cfg.get("cls_name")
        if cls_name not in QWEN3_VL_CONFIG_CLSES:
            problems.append(
                f"rbln_config.json cls_name={cls_name!r}, not {' or '.join(QWEN3_VL_CONFIG_CLSES)} "
                "(not a Qwen3-VL artifact)"
            )
        version = cfg.get("optimum_rbln_version")
        if version and version != EXPECTED_OPTIMUM_RBLN:
            notes.append(f"compiled with optimum-rbln {version}; qvl targets {EXPECTED_OPTIMUM_RBLN}")
        derived = expected_graph_names(cfg)
        listed = [c.get("compiled_model_name") for c in _compile_cfgs(cfg)]
        if not listed:
            problems.append("rbln_config.json has no _compile_cfgs (the artifact was never compiled)")
        elif listed != derived:
            problems.append(
                f"rbln_config.json: _compile_cfgs graphs {listed} do not match decoder_batch_sizes "
                f"{cfg.get('decoder_batch_sizes')} (expected {derived})"
            )
        if not isinstance(cfg.get("visual"), dict):
            problems.append("rbln_config.json has no 'visual' section (optimum-rbln: Submodule visual not found)")
        for name in unsafe_graph_names(cfg)[:4]:
            problems.append(f"rbln_config.json names the graph {name!r}, a path outside the artifact (refused)")
        graphs = graph_files(cfg)
        for info in graphs.values():
            need(info["file"])
        for rel in (RBLN_CONFIG_NAME, "config.json", "torch_artifacts.pth"):
            need(rel)
        for rel in ("visual/rbln_config.json", "visual/config.json", "visual/torch_artifacts.pth"):
            need(rel)
        need_group(PROCESSOR_FILES)
        need_group(TOKENIZER_FILES)
        problems += processor_problems(root, cfg, manifest, read=read) if processor else []
        wanted = {info["file"] for info in graphs.values()}
        for sub in ("", "visual/"):
            base = root / sub if sub else root
            if base.is_dir():
                for f in sorted(base.glob("*.rbln")):
                    rel = f"{sub}{f.name}"
                    if rel not in wanted:
                        unexpected.append(rel)
    else:
        graphs = {}
        for rel in ("config.json", TORCH_CONFIG_NAME, MANIFEST_NAME):
            need(rel)
        weights_missing, weights_present = _torch_weight_files(root)
        expected.extend(weights_present or ["model.safetensors"])
        missing.extend(weights_missing)
        need_group(PROCESSOR_FILES)
        need_group(TOKENIZER_FILES)
        for f in sorted(root.glob("*.rbln")):
            unexpected.append(f.name)

    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        if ".qvl-tmp-" in entry.name or ".qvl-old-" in entry.name:
            unexpected.append(entry.name)

    manifest_check: dict[str, Any]
    modified: list[str] = []
    if manifest is None:
        manifest_check = {"present": False, "ok": None}
        if kind == "rbln":
            notes.append("no qvl-manifest.json (not compiled by qvl): edits after compile cannot be detected")
    else:
        verdict = verify_manifest(root, manifest, known=known)
        modified = verdict["modified"]
        manifest_check = {"present": True, **verdict}
        for rel in verdict["unsafe"][:4]:
            problems.append(f"{MANIFEST_NAME} lists {rel!r}, a path outside the artifact (refused, never read)")
        # files listed in the manifest that are gone are reported as missing too
        for rel in verdict["missing"]:
            if rel not in missing:
                missing.append(rel)
    ok = not (missing or unexpected or problems or modified)
    return {
        "ok": ok,
        "kind": kind,
        "missing": missing,
        "unexpected": unexpected,
        "modified": modified,
        "problems": problems,
        "notes": notes,
        "expected": expected,
        "graphs": graphs,
        "manifest": manifest_check,
    }


def describe_layout_problem(layout: dict[str, Any]) -> str:
    """One line naming the first problems of a failed layout check."""
    parts = []
    if layout["missing"]:
        missing = layout["missing"]  # "model.safetensors (or sharded ...)" already says "model.safetensors"
        missing = [m for m in missing if not any(o != m and o.startswith(f"{m} (") for o in missing)]
        parts.append("missing " + ", ".join(missing[:4]))
    if layout["modified"]:
        parts.append(
            "changed after compile (sha256 differs from qvl-manifest.json): " + ", ".join(layout["modified"][:4])
        )
    if layout["unexpected"]:
        parts.append("unexpected " + ", ".join(layout["unexpected"][:4]))
    parts.extend(layout["problems"][:2])
    return "; ".join(parts)
