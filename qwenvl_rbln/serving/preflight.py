"""The preflight: every check vllm-rbln would fail on (late) or silently work around, run before anything starts.

Its own module because both commands start with it (``qvl serve`` and ``qvl bench-serve``), and it is where an
artifact is refused: a torch or emulated one, a foreign config, missing graphs or processor files, edits since compile.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from qwenvl_rbln.artifacts.checked import CheckedArtifact, open_artifact
from qwenvl_rbln.artifacts.emulated import emulated_graph_files, manifest_marks_emulated
from qwenvl_rbln.artifacts.layout import QWEN3_VL_CONFIG_CLSES, QWEN3_VL_MOE_CONFIG_CLS, expected_graph_names
from qwenvl_rbln.artifacts.manifest import MANIFEST_NAME, RBLN_CONFIG_NAME, TORCH_CONFIG_NAME
from qwenvl_rbln.artifacts.processor_files import Reader
from qwenvl_rbln.errors import InputError
from qwenvl_rbln.paths import user_path
from qwenvl_rbln.serving.options import Artifact
from qwenvl_rbln.units import fmt_json

REQUIRED_KEYS = ("batch_size", "max_seq_len", "kvcache_num_blocks", "prefill_chunk_size")
# vLLM loads tokenizer, processor and chat template from --model, i.e. the artifact directory.
PROCESSOR_GROUPS: tuple[tuple[str, tuple[tuple[str, ...], ...]], ...] = (
    ("processor config", (("processor_config.json",), ("preprocessor_config.json",))),
    ("tokenizer", (("tokenizer.json",), ("vocab.json", "merges.txt"))),
)
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
CHAT_TEMPLATE_KEY_FILES = ("tokenizer_config.json", "processor_config.json")

RECOMPILE = "recompile it on an RBLN host (`qvl compile --preset P -o DIR --force`)"


def ok(checks: list[dict[str, Any]], name: str, detail: str) -> None:
    checks.append({"check": name, "ok": True, "detail": detail})


def warn(checks: list[dict[str, Any]], name: str, detail: str) -> None:
    """A check that passes with a consequence the user must see (``ok`` false, ``warning`` true): never "ok"."""
    checks.append({"check": name, "ok": False, "warning": True, "detail": detail})


def _positive(cfg: dict[str, Any], key: str) -> bool:
    return type(cfg.get(key)) is int and cfg[key] > 0


def _missing_group(root: Path, alternatives: tuple[tuple[str, ...], ...]) -> bool:
    return not any(all((root / name).is_file() for name in names) for names in alternatives)


def _has_chat_template(root: Path, read: Reader) -> str | None:
    for name in CHAT_TEMPLATE_FILES:
        if (root / name).is_file():
            return name
    for name in CHAT_TEMPLATE_KEY_FILES:
        data = read(name)
        if isinstance(data, dict) and data.get("chat_template"):
            return f"{name} (chat_template key)"
    return None


EMULATED_FIX = (
    "compile it for real on an RBLN host (`qvl compile --preset P`, without --emulate) and serve that, or try the "
    "API here on the emulated NPU: `qvl serve --emulate DIR`"
)
# what each command can do with an emulated artifact instead (audit 2026-12-06 L3: bench-serve and deploy gave
# serve's advice)
EMULATED_FIXES = {
    "bench-serve": "benchmark the emulated server here with `qvl bench-serve --emulate DIR` (against `qvl serve "
    "--emulate DIR`), or compile for real on an RBLN host (`qvl compile --preset P`, without --emulate)",
    "deploy": "a deployment needs a real compile (the pod runs its NPU graphs; a --dry-run prints the files for one): "
    "compile on an RBLN host (`qvl compile --preset P`, without --emulate) and deploy that; to try the API here, "
    "`qvl serve --emulate DIR`",
}


def emulated_fix(command: str) -> str:
    return EMULATED_FIXES.get(command, EMULATED_FIX)


def preflight(
    directory: Path, *, verify_hashes: bool = True, emulated: bool = False, command: str = "serve"
) -> Artifact:
    """Every check vllm-rbln would fail on (late) or silently work around, in order; InputError on the first.
    ``emulated``: the artifact must be one ``qvl compile --emulate`` wrote (``qvl serve --emulate``); else it must
    not be."""
    root = user_path(directory, "artifact directory").absolute()
    checks: list[dict[str, Any]] = []
    fix = emulated_fix(command)
    art = _load(root, checks, emulated, fix)
    cfg, manifest = art.cfg, art.manifest
    _check_config(cfg, root / RBLN_CONFIG_NAME, checks)
    check_kv_pool(cfg, root / RBLN_CONFIG_NAME, checks)
    _check_graphs(root, cfg, checks, emulated, fix)
    _check_processor(root, checks, _source_model(manifest), art.read)
    _check_video_class(root, checks, art.read)
    caps_fix = _check_processor_caps(art, checks)
    if manifest is None:
        ok(checks, "manifest hashes", "no qvl-manifest.json: edits after compile cannot be detected")
    elif verify_hashes:
        _check_hashes(art, checks)
    model_config = art.model_config
    if cfg.get("cls_name") == QWEN3_VL_MOE_CONFIG_CLS:
        _note_moe(model_config, checks)
    return Artifact(
        root=root,
        cfg=cfg,
        manifest=manifest,
        model_config=model_config,
        checks=checks,
        processor_fix=caps_fix,
        checked=art,
    )


def _note_moe(model_config: Any, checks: list[dict[str, Any]]) -> None:
    """A Qwen3-VL-MoE artifact: its numbers where they differ from the dense models (ViT depth, out_hidden_size,
    experts), read from its config.json; vllm-rbln loads it through the same optimum-rbln auto class."""
    from qwenvl_rbln.planning.catalogue.modelinfo import geometry_from_config, moe_summary

    try:
        line = moe_summary(geometry_from_config(model_config, "model", "config.json"))
    except InputError as exc:
        raise InputError(exc.message, RECOMPILE) from None
    ok(checks, "model", line or "Qwen3-VL-MoE")


def _load(root: Path, checks: list[dict[str, Any]], emulated: bool, fix: str = EMULATED_FIX) -> CheckedArtifact:
    """rbln_config.json and qvl-manifest.json of an optimum-rbln artifact that qvl's emulator did not write (or, with
    ``emulated``, did), read once (``artifacts.checked``)."""
    if not root.is_dir():
        what = "is a file, not a directory" if root.exists() else "does not exist"
        raise InputError(f"artifact directory {root} {what}", "compile first (`qvl compile --preset P -o DIR`)")
    rbln_config = root / RBLN_CONFIG_NAME
    if not rbln_config.is_file():
        if (root / TORCH_CONFIG_NAME).is_file():
            raise InputError(
                f"{root} is a torch reference artifact (qvl-rbln-config.json), not an optimum-rbln compile; vllm-rbln "
                "would compile the model itself",
                "serve an artifact compiled for the NPU (`qvl compile --preset rebel100-1npu`)",
            )
        raise InputError(
            f"{root} has no {RBLN_CONFIG_NAME}: not an optimum-rbln artifact (vllm-rbln would treat it as a "
            "Hugging Face model and compile it itself)",
            "pass the directory `qvl compile` wrote for an rbln preset",
        )
    art = open_artifact(root)
    manifest = art.manifest
    ok(checks, "rbln_config", f"{rbln_config} loads")
    if emulated:
        return art  # _check_graphs: every graph must be the emulator's
    if manifest_marks_emulated(manifest):
        raise InputError(
            f"{root} was compiled by qvl's CPU emulator (qvl-manifest.json emulated: true): it holds no NPU graphs "
            "vllm-rbln can run on an NPU",
            fix,
        )
    ok(checks, "not emulated", "a real NPU compile" if manifest else "no qvl-manifest.json (not compiled by qvl)")
    return art


def _check_config(cfg: dict[str, Any], path: Path, checks: list[dict[str, Any]]) -> None:
    """Qwen3-VL, optimum-rbln 0.12.x, and every key vllm-rbln asserts on."""
    cls_name = cfg.get("cls_name")
    if cls_name not in QWEN3_VL_CONFIG_CLSES:
        raise InputError(
            f"{path}: cls_name={cls_name!r}, not {' or '.join(QWEN3_VL_CONFIG_CLSES)} (not a Qwen3-VL artifact)",
            "serve a Qwen3-VL artifact compiled by `qvl compile` (or optimum-rbln 0.12 for Qwen3-VL)",
        )
    ok(checks, "cls_name", str(cls_name))
    version = cfg.get("optimum_rbln_version")
    if not (isinstance(version, str) and re.fullmatch(r"0\.12\.\d+(\S*)", version)):
        raise InputError(
            f"{path}: optimum_rbln_version={version!r}, but vllm-rbln loads it with optimum-rbln 0.12.x (0.11.1a1 "
            "takes >=0.11.1a1, 0.12 pins >=0.12.0,<0.12.1; a different version fails at load: 'compiled with "
            "newer/older version of optimum-rbln')",
            f"{RECOMPILE} with optimum-rbln 0.12.0",
        )
    ok(checks, "optimum_rbln_version", f"{version} (loaded by optimum-rbln 0.12.x beside vllm-rbln)")
    missing = [k for k in REQUIRED_KEYS if not _positive(cfg, k)]
    if not (_positive(cfg, "kvcache_block_size") or _positive(cfg, "kvcache_partition_len")):
        missing.append("kvcache_block_size or kvcache_partition_len")
    if missing:
        shown = ", ".join(f"{k}={fmt_json(cfg.get(k))}" if k in cfg else k for k in missing)  # JSON: null, not None
        raise InputError(
            f"{path}: missing or not a positive integer: {shown} (vllm-rbln asserts on these at start-up)", RECOMPILE
        )
    partition, block = cfg.get("kvcache_partition_len"), cfg.get("kvcache_block_size")
    if partition is not None and block is not None and partition != block:
        raise InputError(
            f"{path}: kvcache_partition_len={partition} differs from kvcache_block_size={block} (vllm-rbln "
            "asserts they are equal)",
            RECOMPILE,
        )
    visual = cfg.get("visual")
    buckets = visual.get("max_seq_len") if isinstance(visual, dict) else None
    buckets = [buckets] if type(buckets) is int else buckets
    if not (isinstance(buckets, list) and buckets and all(type(b) is int and b > 0 for b in buckets)):
        raise InputError(
            f"{path}: visual.max_seq_len={buckets!r} is not a list of ViT buckets (the image cap is derived "
            "from the largest)",
            RECOMPILE,
        )
    for where, key in ((cfg, "phases"), (cfg, "_compile_cfgs"), (visual, "_compile_cfgs")):
        value = where.get(key)
        if value is not None and not (
            isinstance(value, list) and all(isinstance(x, str if key == "phases" else dict) for x in value)
        ):
            name = f"visual.{key}" if where is visual else key
            raise InputError(f"{path}: {name}={value!r} is not a list of {key} entries", RECOMPILE)
    dbs = cfg.get("decoder_batch_sizes") or [cfg["batch_size"]]
    if not (isinstance(dbs, list) and all(type(b) is int and b > 0 for b in dbs)):
        raise InputError(f"{path}: decoder_batch_sizes={dbs!r} is not a list of batch sizes", RECOMPILE)
    ok(
        checks,
        "compiled values",
        f"batch_size {cfg['batch_size']}, max_seq_len {cfg['max_seq_len']}, block {block or partition}, "
        f"kvcache_num_blocks {cfg['kvcache_num_blocks']}, prefill_chunk_size {cfg['prefill_chunk_size']}",
    )


def _check_graphs(
    root: Path, cfg: dict[str, Any], checks: list[dict[str, Any]], emulated: bool, fix: str = EMULATED_FIX
) -> None:
    """Every graph optimum-rbln loads (and the host-side files beside them), none written by the emulator (all of
    them, with ``emulated``)."""
    graphs = [f"{name}.rbln" for name in expected_graph_names(cfg)] + ["visual/compiled_model.rbln"]
    others = ["config.json", "torch_artifacts.pth", "visual/config.json", "visual/torch_artifacts.pth"]
    gone = [rel for rel in graphs + others if not (root / rel).is_file()]
    if gone:
        raise InputError(
            f"{root}: missing {', '.join(gone[:4])}{' ...' if len(gone) > 4 else ''} (optimum-rbln loads every "
            "compiled graph named by rbln_config.json)",
            f"restore the files or {RECOMPILE}",
        )
    marked = emulated_graph_files(root, graphs)
    if emulated:
        real = [g for g in graphs if g not in marked]
        if real:
            raise InputError(
                f"{root}: {', '.join(real[:3])} {'is' if len(real) == 1 else 'are'} not a graph of qvl's CPU emulator "
                "(an NPU compile?); --emulate runs only what `qvl compile --emulate` wrote",
                "serve it without --emulate on an RBLN host, or compile with `qvl compile --emulate`",
            )
        ok(checks, "emulated", f"every graph ({', '.join(graphs)}) was written by qvl's CPU emulator: no NPU graph")
        return
    if marked:
        raise InputError(
            f"{root}: {', '.join(marked[:3])} {'was' if len(marked) == 1 else 'were'} written by qvl's CPU "
            "emulator, not compiled for an NPU; vllm-rbln cannot run it on an NPU",
            fix,
        )
    ok(checks, "graph files", ", ".join(graphs))


def _source_model(manifest: dict[str, Any] | None) -> str:
    """The model the artifact was compiled from (the manifest's id), for the hints that say where to copy from."""
    model = (manifest or {}).get("model")
    ident = model.get("id") if isinstance(model, dict) else None
    return ident if isinstance(ident, str) and ident else "the model it was compiled from"


def _check_processor(root: Path, checks: list[dict[str, Any]], source: str, read: Reader) -> None:
    """What vLLM loads from --model: processor config, tokenizer, chat template."""
    for what, groups in PROCESSOR_GROUPS:
        if _missing_group(root, groups):
            names = " or ".join("+".join(g) for g in groups)
            raise InputError(
                f"{root}: no {what} file ({names}); vLLM loads the processor from the artifact directory",
                f"copy it from the source model directory ({source}) into {root}",
            )
    template = _has_chat_template(root, read)
    if template is None:
        raise InputError(
            f"{root}: no chat template (chat_template.jinja, chat_template.json, or a chat_template key in "
            "tokenizer_config.json); vLLM's /v1/chat/completions refuses every request without one",
            f"copy chat_template.jinja (or chat_template.json) from the source model directory into {root}",
        )
    ok(checks, "processor files", f"processor config, tokenizer, chat template ({template})")


def _check_video_class(root: Path, checks: list[dict[str, Any]], read: Reader) -> None:
    """The video processor class vLLM will load must be one qvl's per-frame cap patches (``frame_cap.FAMILIES``),
    else serve would claim a cap the plugin cannot apply: refused before vLLM starts, as ``qvl infer`` refuses it."""
    from qwenvl_rbln.jobs.processor_fix import video_class_problem, video_processor_class

    resolved = video_processor_class(root, read=read)  # may import transformers to look a class up: once
    problem = video_class_problem(root, resolved)
    if problem is not None:
        raise InputError(f"{problem['message']}; nothing was started", problem["fix"])
    section = f"{resolved['section']}." if resolved["section"] else ""
    where = f"{resolved['file']} {section}{resolved['key']}" if resolved["file"] else "the model type's default"
    ok(checks, "video processor", f"{resolved['cls']} ({where}): qvl's per-frame video cap patches it")


def _check_processor_caps(art: CheckedArtifact, checks: list[dict[str, Any]]) -> dict[str, Any]:
    """What the processor files vLLM loads let through, against the largest compiled bucket.

    Files that disagree with the buckets (the checkpoint's, as the product doc's scripts and plain optimum-rbln save
    them) are not refused: ``serving.command`` caps images per request and video frames through the plugin, without
    editing the artifact. Files that disagree with the caps the compile recorded (edited since) are refused.
    Returns ``{"image": needs a cap, "video": needs a cap, "min_pixels": the files' image minimum, "why": [...]}``.
    """
    from qwenvl_rbln.artifacts.layout import vit_buckets_and_patch
    from qwenvl_rbln.artifacts.processor_files import FRAME_KEY, findings, sections

    root = art.root
    found = vit_buckets_and_patch(root, art.cfg, read=art.read)
    assert found is not None  # _check_config refused a config without a valid bucket list
    buckets, patch = found
    recorded = [
        f["message"]
        for f in findings(root, buckets, patch, (art.manifest or {}).get("processor"), read=art.read)
        if f["what"] == "recorded"
    ]
    if recorded:
        raise InputError(
            f"{root}: {recorded[0].partition('; fix: ')[0]}",
            f"{recorded[0].partition('; fix: ')[2] or RECOMPILE}; the manifest recorded other caps than the files hold",
        )
    cap = max(buckets) * patch**2
    fix: dict[str, Any] = {"min_pixels": None, "why": [], "cap": cap}
    seen = {"image": False, "video": False}
    bad = {"image": False, "video": False}
    for name, section, kind, _, part in sections(root, read=art.read):
        if not part:
            continue
        where = f"{name} {section}" if section else name
        size = part.get("size") if isinstance(part.get("size"), dict) else {}
        if kind == "image":
            longest = _count(part.get("max_pixels")) or _count(size.get("longest_edge"))
            fix["min_pixels"] = fix["min_pixels"] or _count(part.get("min_pixels")) or _count(size.get("shortest_edge"))
            ok_here = longest is not None and longest <= cap
            if not ok_here:
                fix["why"].append(f"{where} size.longest_edge={longest} (images need <= {cap})")
        else:
            frame = _count(part.get(FRAME_KEY))
            ok_here = frame is not None and frame <= cap
            if not ok_here:
                fix["why"].append(f"{where} {FRAME_KEY}={frame} (each frame needs <= {cap})")
        seen[kind] = True
        bad[kind] = bad[kind] or not ok_here
    for kind in ("image", "video"):
        fix[kind] = bad[kind] or not seen[kind]
        if not seen[kind]:
            fix["why"].append(f"no {kind} processor section in the processor files (transformers' defaults apply)")
    if not fix["image"] and not fix["video"]:
        ok(checks, "processor caps", "the processor files' image and video caps fit the largest ViT bucket")
    return fix


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else None


def _check_hashes(art: CheckedArtifact, checks: list[dict[str, Any]]) -> None:
    root, manifest = art.root, art.manifest or {}
    verdict = art.verify()  # the files read above are compared from the bytes read, not read again
    bad = verdict["modified"] + verdict["missing"] + verdict["unsafe"]
    if bad:
        raise InputError(
            f"{root}: {', '.join(bad[:4])} changed or missing since compile (sha256 differs from {MANIFEST_NAME})",
            f"restore the files or {RECOMPILE}; `qvl load-check DIR --no-runtime` lists every difference",
        )
    extra = f"; not in the manifest (added later): {', '.join(verdict['extra'][:4])}" if verdict["extra"] else ""
    ok(checks, "manifest hashes", f"{len(manifest.get('files') or {})} files match{extra}")


def _writer(attn: str, minimum: int) -> str:
    """Who could have written such a pool, without blaming optimum-rbln for what it does not do."""
    if attn == "flash_attn":
        return f"optimum-rbln 0.12 refuses such a flash pool at compile (num_min_blocks {minimum})"
    return (
        f"optimum-rbln 0.12 compiles such an eager pool without checking it (its num_min_blocks {minimum} is not "
        "enforced for eager attention); qvl compile refuses it"
    )


def check_kv_pool(cfg: dict[str, Any], path: Path, checks: list[dict[str, Any]]) -> None:
    """The KV block pool holds one sequence of max_seq_len inside vLLM, or the artifact is refused (vllm-rbln
    issue #957: a prompt the pool cannot hold is admitted and never scheduled).

    vllm-rbln (v0.11.1a1 ``utils/optimum/converter/from_optimum.py`` ``update_num_blocks``,
    ``model_executor/models/optimum/model_base.py`` ``KVCacheBlockAdapter``) hands vLLM ``kvcache_num_blocks + 1``
    blocks when the pool is full (``batch_size x ceil(max_seq_len / block)`` blocks or more), else
    ``kvcache_num_blocks``, and vLLM keeps one as its null block: a short pool holds ``(kvcache_num_blocks - 1) x
    block`` tokens for one sequence. optimum-rbln 0.12 refuses a flash pool below that: ``kvcache_num_blocks``
    under ``num_min_blocks`` (``max(max_seq_len / block, batch_size) + 1``, capped at the full pool) stops its
    compile, its automatic sizing and its ``--set-kvcache-num-blocks``. An eager pool it checks only from above: it
    compiles ``kvcache_num_blocks`` 1 at batch 2 (audit 2026-12-04b F3), which this check refuses, and which
    ``qvl compile`` refuses before compiling (eager pools below one block per sequence, ``planning/lm/checks.py``).
    Lowering ``--max-model-len`` instead is no way out: vllm-rbln resets it to
    max_seq_len, and held lower (qvl's former plugin guard) it sizes every block table below the compiled graph's
    and every prefill fails (``shared/engine/README.md``)."""
    import math

    from qwenvl_rbln.planning.lm.rules import default_attn_impl, kv_block_counts

    blocks, block = cfg["kvcache_num_blocks"], cfg.get("kvcache_block_size") or cfg["kvcache_partition_len"]
    max_len, batch = cfg["max_seq_len"], cfg["batch_size"]
    per_seq = math.ceil(max_len / block)
    if blocks >= batch * per_seq:
        ok(checks, "kv pool", f"{blocks} blocks of {block} tokens: a full pool for batch_size {batch} x {max_len}")
        return
    usable = (blocks - 1) * block
    if usable >= max_len:
        ok(
            checks,
            "kv pool",
            f"{blocks} blocks of {block} tokens: vLLM keeps one as its null block, and {blocks - 1} still hold one "
            f"sequence of max_seq_len {max_len}, not {batch} at once: the scheduler preempts a request when blocks run "
            "out and recomputes it later (see 'preemption')",
        )
        return
    attn = cfg.get("attn_impl") or default_attn_impl(cfg.get("kvcache_partition_len"))
    _, minimum = kv_block_counts(max_len, block, batch, attn)
    raise InputError(
        f"{path}: kvcache_num_blocks={blocks} is short of batch_size {batch} x {per_seq} blocks of {block} tokens, so "
        f"vllm-rbln hands vLLM {blocks} blocks and vLLM keeps one as its null block: {blocks - 1} x {block} = "
        f"{usable} tokens, below max_seq_len {max_len}; a longer prompt would be admitted and hang (vllm-rbln issue "
        f"#957). {_writer(attn, minimum)}; nothing was started",
        f"{RECOMPILE} with kvcache_num_blocks >= {per_seq + 1} (or leave it to the planner)",
    )
