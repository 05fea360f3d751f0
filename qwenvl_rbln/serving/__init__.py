"""The vllm-rbln hand-off: preflight a compiled artifact, then build ``vllm serve`` / ``vllm bench serve`` as data.

vllm-rbln (the vLLM plugin for RBLN NPUs) treats a directory holding ``rbln_config.json`` as a precompiled
optimum-rbln artifact. It silently overwrites several flags with the compiled values and fails late, and
cryptically, on the rest (facts: ``shared/reference/vllm-rbln-serving.md``). So qvl checks the artifact and the
flags first and hands over a command that is right the first time. It never imports vllm (it cannot be installed
on the machines qvl is tested on): this module returns ``Launch`` data (argv, the environment variables qvl sets,
the checks that passed); ``commands/serve_cmd.py`` prints it or execs it.

Device ids given to qvl (``--device``, ``--visual-device``, the compiled placement) are physical NPU ids, as
``rbln-smi`` lists them. qvl sets ``RBLN_VISIBLE_DEVICES`` to exactly those devices, and vllm-rbln, like
``CUDA_VISIBLE_DEVICES`` for vLLM on GPUs, numbers the visible devices from 0: the ids in
``--rbln-optimum-overrides`` are positions in that list (the same numbers whenever the devices are 0..n-1).
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenvl_rbln import artifacts
from qwenvl_rbln.errors import DependencyMissing, InputError
from qwenvl_rbln.paths import user_path

PLUGIN_NAME = "qvl_vit_packing"  # the vllm.general_plugins entry point (pyproject.toml)
PLUGIN_GROUP = "vllm.general_plugins"
PACKING_ENV = "QVL_VIT_PACKING"  # "1": the plugin installs the packed ViT forward in every vLLM process
VLLM_INSTALL_HINT = (
    "install vllm-rbln on the RBLN host (`pip install vllm-rbln==0.12.0`; it brings vllm and pins optimum-rbln "
    "0.12.0), or put the directory holding the `vllm` executable first on PATH; `--dry-run` prints the command "
    "without it"
)
DEFAULT_HOST = "127.0.0.1"  # local only unless asked: `--host 0.0.0.0` serves other machines
DEFAULT_PORT = 8000  # vLLM's own default
REQUIRED_KEYS = ("batch_size", "max_seq_len", "kvcache_num_blocks", "prefill_chunk_size")
# vLLM loads tokenizer, processor and chat template from --model, i.e. the artifact directory.
PROCESSOR_GROUPS: tuple[tuple[str, tuple[tuple[str, ...], ...]], ...] = (
    ("processor config", (("processor_config.json",), ("preprocessor_config.json",))),
    ("tokenizer", (("tokenizer.json",), ("vocab.json", "merges.txt"))),
)
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
CHAT_TEMPLATE_KEY_FILES = ("tokenizer_config.json", "processor_config.json")
PROMPT_MARGIN = 64  # chat template and special tokens around a benchmark prompt


@dataclass
class Launch:
    """What to run: ``argv`` exactly, with ``env`` set (a None value unsets it) on top of the inherited environment."""

    argv: list[str]
    env: dict[str, str | None]
    checks: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "env": dict(self.env), "checks": list(self.checks)}

    def exec_env(self, inherited: Mapping[str, str]) -> dict[str, str]:
        out = dict(inherited)
        for key, value in self.env.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = value
        return out


@dataclass
class Artifact:
    """A compiled artifact that passed the preflight."""

    root: Path
    cfg: dict[str, Any]
    manifest: dict[str, Any] | None
    model_config: dict[str, Any]
    checks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def buckets(self) -> list[int]:
        buckets = self.cfg["visual"]["max_seq_len"]
        return sorted([buckets] if isinstance(buckets, int) else buckets)

    @property
    def patch_size(self) -> int:
        value = (self.model_config.get("vision_config") or {}).get("patch_size", 16)
        return value if type(value) is int and value > 0 else 16

    @property
    def merge_size(self) -> int:
        value = (self.model_config.get("vision_config") or {}).get("spatial_merge_size", 2)
        return value if type(value) is int and value > 0 else 2

    @property
    def max_pixels(self) -> int:
        return self.buckets[-1] * self.patch_size**2


@dataclass
class ServeOptions:
    directory: Path | None = None
    preset: str | None = None
    device: Any = None
    visual_device: Any = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    served_model_name: str | None = None
    vit_packing: bool | None = None  # None: the manifest's / preset's runtime.vit_packing, else on
    extra: list[str] = field(default_factory=list)


@dataclass
class BenchOptions:
    directory: Path | None = None
    preset: str | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    served_model_name: str | None = None
    num_prompts: int = 100
    input_len: int = 128
    output_len: int = 128
    seed: int = 0
    extra: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------- preflight

RECOMPILE = "recompile it on an RBLN host (`qvl compile --preset P -o DIR --force`)"


def _ok(checks: list[dict[str, Any]], name: str, detail: str) -> None:
    checks.append({"check": name, "ok": True, "detail": detail})


def _positive(cfg: dict[str, Any], key: str) -> bool:
    return type(cfg.get(key)) is int and cfg[key] > 0


def _missing_group(root: Path, alternatives: tuple[tuple[str, ...], ...]) -> bool:
    return not any(all((root / name).is_file() for name in names) for names in alternatives)


def _has_chat_template(root: Path) -> str | None:
    for name in CHAT_TEMPLATE_FILES:
        if (root / name).is_file():
            return name
    for name in CHAT_TEMPLATE_KEY_FILES:
        try:
            data = json.loads((root / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("chat_template"):
            return f"{name} (chat_template key)"
    return None


EMULATED_FIX = "compile it for real on an RBLN host (`qvl compile --preset P`, without --emulate) and serve that"


def preflight(directory: Path, *, verify_hashes: bool = True) -> Artifact:
    """Every check vllm-rbln would fail on (late) or silently work around, in order; InputError on the first."""
    root = user_path(directory, "artifact directory").absolute()
    checks: list[dict[str, Any]] = []
    cfg, manifest = _load(root, checks)
    _check_config(cfg, root / artifacts.RBLN_CONFIG_NAME, checks)
    _check_graphs(root, cfg, checks)
    _check_processor(root, checks)
    if manifest is None:
        _ok(checks, "manifest hashes", "no qvl-manifest.json: edits after compile cannot be detected")
    elif verify_hashes:
        _check_hashes(root, manifest, checks)
    model_config = artifacts.read_json(root / "config.json")
    return Artifact(root=root, cfg=cfg, manifest=manifest, model_config=model_config, checks=checks)


def _load(root: Path, checks: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """rbln_config.json and qvl-manifest.json of an optimum-rbln artifact that qvl's emulator did not write."""
    if not root.is_dir():
        what = "is a file, not a directory" if root.exists() else "does not exist"
        raise InputError(f"artifact directory {root} {what}", "compile first (`qvl compile --preset P -o DIR`)")
    rbln_config = root / artifacts.RBLN_CONFIG_NAME
    if not rbln_config.is_file():
        if (root / artifacts.TORCH_CONFIG_NAME).is_file():
            raise InputError(
                f"{root} is a torch reference artifact (qvl-rbln-config.json), not an optimum-rbln compile; vllm-rbln "
                "would compile the model itself",
                "serve an artifact compiled for the NPU (`qvl compile --preset rebel100-1npu`)",
            )
        raise InputError(
            f"{root} has no {artifacts.RBLN_CONFIG_NAME}: not an optimum-rbln artifact (vllm-rbln would treat it as a "
            "Hugging Face model and compile it itself)",
            "pass the directory `qvl compile` wrote for an rbln preset",
        )
    cfg = artifacts.read_json(rbln_config)
    _ok(checks, "rbln_config", f"{rbln_config} loads")
    manifest = artifacts.read_manifest(root)
    if manifest is not None and manifest.get("emulated") is True:
        raise InputError(
            f"{root} was compiled by qvl's CPU emulator (qvl-manifest.json emulated: true): it holds no NPU graphs "
            "vllm-rbln can run",
            EMULATED_FIX,
        )
    _ok(checks, "not emulated", "a real NPU compile" if manifest else "no qvl-manifest.json (not compiled by qvl)")
    return cfg, manifest


def _check_config(cfg: dict[str, Any], path: Path, checks: list[dict[str, Any]]) -> None:
    """Qwen3-VL, optimum-rbln 0.12.x, and every key vllm-rbln asserts on."""
    cls_name = cfg.get("cls_name")
    if cls_name != artifacts.QWEN3_VL_CONFIG_CLS:
        raise InputError(
            f"{path}: cls_name={cls_name!r}, not {artifacts.QWEN3_VL_CONFIG_CLS} (not a Qwen3-VL artifact)",
            "serve a Qwen3-VL artifact compiled by `qvl compile` (or optimum-rbln 0.12 for Qwen3-VL)",
        )
    _ok(checks, "cls_name", str(cls_name))
    version = cfg.get("optimum_rbln_version")
    if not (isinstance(version, str) and re.fullmatch(r"0\.12\.\d+(\S*)", version)):
        raise InputError(
            f"{path}: optimum_rbln_version={version!r}, but vllm-rbln 0.12 pins optimum-rbln 0.12.x (a "
            "different version fails at load: 'compiled with newer/older version of optimum-rbln')",
            f"{RECOMPILE} with optimum-rbln 0.12.0",
        )
    _ok(checks, "optimum_rbln_version", f"{version} (vllm-rbln 0.12 pins optimum-rbln >=0.12.0,<0.12.1)")
    missing = [k for k in REQUIRED_KEYS if not _positive(cfg, k)]
    if not (_positive(cfg, "kvcache_block_size") or _positive(cfg, "kvcache_partition_len")):
        missing.append("kvcache_block_size or kvcache_partition_len")
    if missing:
        shown = ", ".join(f"{k}={cfg.get(k)!r}" if k in cfg else k for k in missing)
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
    _ok(
        checks,
        "compiled values",
        f"batch_size {cfg['batch_size']}, max_seq_len {cfg['max_seq_len']}, block {block or partition}, "
        f"kvcache_num_blocks {cfg['kvcache_num_blocks']}, prefill_chunk_size {cfg['prefill_chunk_size']}",
    )


def _check_graphs(root: Path, cfg: dict[str, Any], checks: list[dict[str, Any]]) -> None:
    """Every graph optimum-rbln loads (and the host-side files beside them), none written by the emulator."""
    from qwenvl_rbln.backends.emulator.graph import is_emulated_file  # reads a safetensors header only

    graphs = [f"{name}.rbln" for name in artifacts.expected_graph_names(cfg)] + ["visual/compiled_model.rbln"]
    others = ["config.json", "torch_artifacts.pth", "visual/config.json", "visual/torch_artifacts.pth"]
    gone = [rel for rel in graphs + others if not (root / rel).is_file()]
    if gone:
        raise InputError(
            f"{root}: missing {', '.join(gone[:4])}{' ...' if len(gone) > 4 else ''} (optimum-rbln loads every "
            "compiled graph named by rbln_config.json)",
            f"restore the files or {RECOMPILE}",
        )
    emulated = [rel for rel in graphs if is_emulated_file(root / rel)]
    if emulated:
        raise InputError(
            f"{root}: {', '.join(emulated[:3])} {'was' if len(emulated) == 1 else 'were'} written by qvl's CPU "
            "emulator, not compiled for an NPU; vllm-rbln cannot run it",
            EMULATED_FIX,
        )
    _ok(checks, "graph files", ", ".join(graphs))


def _check_processor(root: Path, checks: list[dict[str, Any]]) -> None:
    """What vLLM loads from --model: processor config, tokenizer, chat template."""
    for what, groups in PROCESSOR_GROUPS:
        if _missing_group(root, groups):
            names = " or ".join("+".join(g) for g in groups)
            raise InputError(
                f"{root}: no {what} file ({names}); vLLM loads the processor from the artifact directory",
                f"copy it from the source model directory (e.g. Qwen/Qwen3-VL-2B-Instruct) into {root}",
            )
    template = _has_chat_template(root)
    if template is None:
        raise InputError(
            f"{root}: no chat template (chat_template.jinja, chat_template.json, or a chat_template key in "
            "tokenizer_config.json); vLLM's /v1/chat/completions refuses every request without one",
            f"copy chat_template.jinja (or chat_template.json) from the source model directory into {root}",
        )
    _ok(checks, "processor files", f"processor config, tokenizer, chat template ({template})")


def _check_hashes(root: Path, manifest: dict[str, Any], checks: list[dict[str, Any]]) -> None:
    verdict = artifacts.verify_manifest(root, manifest)
    bad = verdict["modified"] + verdict["missing"] + verdict["unsafe"]
    if bad:
        raise InputError(
            f"{root}: {', '.join(bad[:4])} changed or missing since compile (sha256 differs from "
            f"{artifacts.MANIFEST_NAME})",
            f"restore the files or {RECOMPILE}; `qvl load-check DIR --no-runtime` lists every difference",
        )
    extra = f"; not in the manifest (added later): {', '.join(verdict['extra'][:4])}" if verdict["extra"] else ""
    _ok(checks, "manifest hashes", f"{len(manifest.get('files') or {})} files match{extra}")


# ----------------------------------------------------------------------------------- pass-through flags


def parse_flags(tokens: Sequence[str]) -> list[tuple[str, str | None, int, int]]:
    """(normalised flag, value, first index, token count) for every ``--flag value`` / ``--flag=value`` / ``-tp N``.

    vLLM's parser accepts ``_`` for ``-`` in flag names and dotted JSON keys (``--mm-processor-kwargs.max_pixels``);
    both are normalised to the base flag here.
    """
    out = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("-") and not _is_number(tok):
            name, eq, value = tok.partition("=")
            if name.startswith("--"):  # the flag's own name, not a dotted JSON key after it
                head, dot, key = name.partition(".")
                name = head.replace("_", "-") + dot + key
            if eq:
                out.append((name, value, i, 1))
            elif i + 1 < len(tokens) and (not tokens[i + 1].startswith("-") or _is_number(tokens[i + 1])):
                out.append((name, tokens[i + 1], i, 2))
                i += 1
            else:
                out.append((name, None, i, 1))
        i += 1
    return out


def _is_number(tok: str) -> bool:
    try:
        float(tok)
    except ValueError:
        return False
    return True


def parse_count(value: str | None) -> int | None:
    """vLLM's human-readable integers: 4096, 32k (x1000), 32K (x1024), 1m, 1M; None when it is not one."""
    if value is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*", value)
    if not m:
        return None
    scale = {"": 1, "k": 10**3, "K": 2**10, "m": 10**6, "M": 2**20, "g": 10**9, "G": 2**30}[m.group(2)]
    number = float(m.group(1)) * scale
    return int(number) if number == int(number) else None


def _refuse(flag: str, value: str | None, why: str, fix: str) -> InputError:
    shown = flag if value is None else f"{flag} {value}"
    return InputError(f"pass-through flag `{shown}` {why}; nothing was started", fix)


def _must_equal(flag: str, value: str | None, want: int, what: str) -> None:
    if parse_count(value) != want:
        raise _refuse(
            flag,
            value,
            f"conflicts with the artifact: {what} is {want} (vllm-rbln overwrites it or fails on it)",
            f"drop {flag} (qvl passes the compiled value) or recompile with the value you want",
        )


def check_pass_through(extra: Sequence[str], art: Artifact, owned: Mapping[str, str]) -> set[str]:
    """Refuse pass-through flags that conflict with the artifact or with qvl's own options.

    Returns the replaceable flags the user gave (their value replaces qvl's).
    """
    cfg = art.cfg
    block = cfg.get("kvcache_block_size") or cfg.get("kvcache_partition_len")
    replaced: set[str] = set()
    for flag, value, _, _ in parse_flags(extra):
        base = flag.split(".", 1)[0]
        if base in ("--tensor-parallel-size", "-tp"):
            if parse_count(value) != 1:
                raise _refuse(
                    flag,
                    value,
                    "is refused by vllm-rbln on a compiled artifact (tensor parallelism is fixed at 1)",
                    "drop it; the artifact's num_devices decides how many NPUs a graph uses",
                )
        elif base in ("--pipeline-parallel-size", "-pp"):
            if parse_count(value) != 1:
                raise _refuse(flag, value, "is refused by vllm-rbln (no pipeline parallelism)", "drop it")
        elif base == "--speculative-config":
            raise _refuse(flag, value, "is refused by vllm-rbln (no speculative decoding)", "drop it")
        elif base == "--max-num-batched-tokens":
            _must_equal(flag, value, cfg["prefill_chunk_size"], "the compiled prefill_chunk_size")
        elif base == "--max-model-len":
            _must_equal(flag, value, cfg["max_seq_len"], "the compiled max_seq_len")
        elif base == "--max-num-seqs":
            _must_equal(flag, value, cfg["batch_size"], "the compiled batch_size")
        elif base == "--block-size":
            _must_equal(flag, value, block, "the compiled kvcache_block_size")
        elif base in owned:
            raise _refuse(flag, value, "is set by qvl", f"use {owned[base]} instead")
        elif base == "--mm-processor-kwargs":
            _check_max_pixels(flag, value, art)
            replaced.add(base)
        elif base == "--limit-mm-per-prompt":
            replaced.add(base)
    return replaced


def _check_max_pixels(flag: str, value: str | None, art: Artifact) -> None:
    pixels: Any = None
    if flag.endswith(".max_pixels"):
        pixels = parse_count(value)
    elif flag == "--mm-processor-kwargs":
        try:
            data = json.loads(value or "")
        except ValueError:
            raise _refuse(flag, value, "is not a JSON object", "pass JSON, e.g. '{\"max_pixels\": 802816}'") from None
        pixels = data.get("max_pixels") if isinstance(data, dict) else None
    if isinstance(pixels, int | float) and pixels > art.max_pixels:
        raise _refuse(
            flag,
            value,
            f"lets images exceed the largest compiled ViT bucket ({art.buckets[-1]} patches = max_pixels "
            f"{art.max_pixels}); vllm-rbln would fail on such an image with 'Required seq_len(N) is larger than "
            "available max_seq_len'",
            f"use max_pixels <= {art.max_pixels}, or drop it (qvl passes {art.max_pixels})",
        )


# ------------------------------------------------------------------------------------------- directory


def resolve_directory(directory: Path | None, preset: str | None, command: str) -> tuple[Path, list[str]]:
    """DIR as ``qvl infer`` picks it: the argument, else the last compile's directory, else the preset's."""
    if directory is not None:
        return user_path(directory, "artifact directory"), []
    from qwenvl_rbln.inference.target import default_directory

    try:
        found, _, warnings = default_directory(preset, [])
    except InputError as exc:
        raise InputError(exc.message, (exc.hint or "").replace("qvl infer", f"qvl {command}")) from None
    return found, warnings


# ------------------------------------------------------------------------------------------ placement


def _ids(value: Any, n: int, flag: str) -> list[int]:
    items = value if isinstance(value, list) else [value]
    if not items or not all(type(i) is int and i >= 0 for i in items):
        raise InputError(
            f"{flag}: the placement {value!r} (recorded in {artifacts.MANIFEST_NAME}) is not an NPU id or a list of "
            "them",
            f"pass {flag} explicitly (e.g. {flag} 0), or recompile the artifact",
        )
    if isinstance(value, list):
        if len(value) != n:
            raise InputError(
                f"{flag} {','.join(map(str, value))} lists {len(value)} devices but the graphs were compiled for "
                f"num_devices={n}",
                f"pass {n} device id{'s' if n != 1 else ''} ({flag} {','.join(str(i) for i in range(n))})",
            )
        return list(value)
    return list(range(value, value + n))  # an int with num_devices > 1: that many consecutive devices


def placement(art: Artifact, device: Any, visual_device: Any, preset_placement: dict | None) -> dict[str, Any]:
    """Requested LM/ViT devices (default: as compiled), RBLN_VISIBLE_DEVICES and the overrides vllm-rbln reads."""
    recorded = artifacts.placement_from_artifact(art.cfg, art.manifest)
    source = recorded.pop("source")
    if source != artifacts.MANIFEST_NAME and preset_placement:
        recorded, source = dict(preset_placement), "the preset's placement"
    lm = device if device is not None else recorded["device"]
    if visual_device is not None:
        vis = visual_device
    elif device is None or recorded.get("visual_device") != recorded.get("device"):
        vis = recorded.get("visual_device", lm)
    else:
        vis = lm
    target = artifacts.compile_target(art.cfg, art.manifest)
    lm_ids = _ids(lm, target["num_devices"], "--device")
    vis_ids = _ids(vis, target["visual_num_devices"], "--visual-device")
    visible = sorted(set(lm_ids) | set(vis_ids))

    def local(ids: list[int], value: Any) -> Any:
        pos = [visible.index(i) for i in ids]
        return pos if isinstance(value, list) else pos[0]

    overrides = {"device": local(lm_ids, lm), "visual": {"device": local(vis_ids, vis)}}
    return {
        "device": lm,
        "visual_device": vis,
        "source": source if device is None and visual_device is None else "--device/--visual-device",
        "visible": visible,
        "overrides": overrides,
    }


# ---------------------------------------------------------------------------------------------- serve


def _served_name(art: Artifact) -> str:
    model = (art.manifest or {}).get("model")
    ident = model.get("id") if isinstance(model, dict) else None
    if isinstance(ident, str) and re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", ident):
        return ident
    return art.root.name


def _preset_plan(preset: str | None) -> Any:
    if preset is None:
        return None
    from qwenvl_rbln.planning.plan import build_plan

    return build_plan(preset)


def limit_mm_per_prompt(art: Artifact, plan: Any) -> tuple[dict[str, int], str]:
    """Items per prompt: the preset's ``runtime.limit_mm_per_prompt`` when it has one, else as many of the largest
    image (capped at the largest bucket) and of the largest video (the recorded processor caps) as fit the context."""
    runtime = getattr(plan, "runtime", None) or (art.manifest or {}).get("runtime") or {}
    given = runtime.get("limit_mm_per_prompt") if isinstance(runtime, dict) else None
    if isinstance(given, dict) and given:
        return dict(given), "the preset's runtime.limit_mm_per_prompt"
    from qwenvl_rbln.vision.geometry import VIDEO_MAX_PIXELS

    caps = getattr(plan, "processor", None)
    caps = caps.to_dict() if caps is not None else (art.manifest or {}).get("processor") or {}
    video_pixels = caps.get("video_max_pixels") if isinstance(caps, dict) else None
    video_pixels = video_pixels if type(video_pixels) is int and video_pixels > 0 else VIDEO_MAX_PIXELS
    context = art.cfg["max_seq_len"]
    image_tokens = art.buckets[-1] // art.merge_size**2
    # a video of T frames at h*w pixels each: (T/2) ViT calls of h*w/patch^2 patches, /merge^2 LM tokens each
    video_tokens = max(1, video_pixels // (2 * art.patch_size**2 * art.merge_size**2))
    limits = {"image": max(1, context // image_tokens), "video": context // video_tokens}
    where = "the recorded processor caps" if caps else "the default video caps"
    return limits, f"largest image ({image_tokens} tokens) and video ({video_tokens} tokens, {where}) per context"


def _runtime_packing(art: Artifact, plan: Any) -> tuple[bool, str]:
    for runtime, where in ((getattr(plan, "runtime", None), "the preset"), ((art.manifest or {}).get("runtime"), "")):
        if isinstance(runtime, dict) and isinstance(runtime.get("vit_packing"), bool):
            return runtime["vit_packing"], where or artifacts.MANIFEST_NAME
    return True, "default"


def _packing_available() -> bool:
    from importlib.util import find_spec

    try:
        return find_spec("qwenvl_rbln.backends.vit_packing") is not None
    except (ImportError, ValueError):
        return False


SERVE_OWNED = {
    "--host": "qvl serve --host",
    "--port": "qvl serve --port",
    "--served-model-name": "qvl serve --served-model-name",
    "--rbln-optimum-overrides": "qvl serve --device / --visual-device",
    "--model": "qvl serve DIR",
}


def serve_command(opts: ServeOptions, environ: Mapping[str, str]) -> tuple[Launch, list[str]]:
    """Preflight, then ``vllm serve DIR ...`` and its environment; InputError before anything starts."""
    directory, warnings = resolve_directory(opts.directory, opts.preset, "serve")
    art = preflight(directory)
    plan = _preset_plan(opts.preset)
    checks = list(art.checks)
    replaced = check_pass_through(opts.extra, art, SERVE_OWNED)
    where = placement(art, opts.device, opts.visual_device, getattr(plan, "placement", None))
    env = _placement_env(where, environ, checks)
    cfg = art.cfg
    argv = ["vllm", "serve", str(art.root), "--host", opts.host, "--port", str(opts.port)]
    argv += ["--served-model-name", opts.served_model_name or _served_name(art)]
    argv += ["--max-model-len", str(cfg["max_seq_len"]), "--max-num-seqs", str(cfg["batch_size"])]
    if "--mm-processor-kwargs" not in replaced:
        argv += ["--mm-processor-kwargs", json.dumps({"max_pixels": art.max_pixels})]
    _ok(checks, "max_pixels", f"{art.buckets[-1]} patches (largest ViT bucket) x {art.patch_size}^2 = {art.max_pixels}")
    if "--limit-mm-per-prompt" not in replaced:
        limits, limits_source = limit_mm_per_prompt(art, plan)
        argv += ["--limit-mm-per-prompt", json.dumps(limits)]
        _ok(checks, "limit_mm_per_prompt", f"{json.dumps(limits)} ({limits_source})")
    argv += ["--rbln-optimum-overrides", json.dumps(where["overrides"]), *opts.extra]
    if opts.vit_packing is not None:
        packing, source = opts.vit_packing, "--vit-packing" if opts.vit_packing else "--no-vit-packing"
    else:
        packing, source = _runtime_packing(art, plan)
    env.update(_packing_env(packing, source, environ, checks, warnings))
    return Launch(argv=argv, env=env, checks=checks), warnings


def _placement_env(where: dict[str, Any], environ: Mapping[str, str], checks: list[dict[str, Any]]) -> dict:
    visible = ",".join(map(str, where["visible"]))
    inherited = environ.get("RBLN_VISIBLE_DEVICES")
    note = f" (replaces the inherited {inherited}: qvl's ids are physical NPU ids)"
    _ok(
        checks,
        "placement",
        f"LM on NPU {where['device']}, ViT on NPU {where['visual_device']} ({where['source']}); "
        f"RBLN_VISIBLE_DEVICES={visible}{note if inherited not in (None, visible) else ''}",
    )
    env: dict[str, str | None] = {"RBLN_VISIBLE_DEVICES": visible}
    if "RBLN_DEVICES" in environ:
        env["RBLN_DEVICES"] = None  # the deprecated alias must not pick other devices
    return env


def _packing_env(
    packing: bool, source: str, environ: Mapping[str, str], checks: list[dict[str, Any]], warnings: list[str]
) -> dict[str, str | None]:
    """QVL_VIT_PACKING for the plugin, and the plugin added to a VLLM_PLUGINS allowlist when one is set."""
    env: dict[str, str | None] = {PACKING_ENV: "1" if packing else "0"}
    if not packing:
        _ok(checks, "vit packing", f"off ({source})")
        return env
    if environ.get("VLLM_PLUGINS") is not None:
        allowed = [p for p in environ["VLLM_PLUGINS"].split(",") if p.strip()]
        if PLUGIN_NAME not in allowed:  # an allowlist loads nothing else: add the packing plugin to it
            env["VLLM_PLUGINS"] = ",".join([*allowed, PLUGIN_NAME])
    detail = (
        f"on ({source}): the {PLUGIN_GROUP} entry point {PLUGIN_NAME} installs the packed ViT forward in every vLLM "
        "process (qvl must be installed in vllm's Python environment)"
    )
    if not _packing_available():
        detail += "; this qvl has no qwenvl_rbln.backends.vit_packing, so vLLM will run unpacked"
        warnings.append("ViT packing is not available in this qvl build: vLLM will run the ViT unpacked")
    _ok(checks, "vit packing", detail)
    return env


# ---------------------------------------------------------------------------------------------- bench


def bench_images(art: Artifact, input_len: int, output_len: int) -> tuple[list[tuple[int, int, int]], list[str]]:
    """One square image size per compiled ViT bucket that lands in that bucket and whose prompt fits the context:
    [(side px, bucket, LM tokens)], and notes on the buckets left out."""
    from qwenvl_rbln.vision.buckets import select_bucket
    from qwenvl_rbln.vision.geometry import IMAGE_MIN_PIXELS, image_geometry

    sizes: list[tuple[int, int, int]] = []
    notes: list[str] = []
    unit = art.merge_size  # a side of p patches must be a multiple of the merge size (factor patch*merge px)
    for bucket in art.buckets:
        side_patches = (math.isqrt(bucket) // unit) * unit
        if side_patches < unit:
            notes.append(f"bucket {bucket}: too small for any image")
            continue
        side = side_patches * art.patch_size
        geo = image_geometry(
            side,
            side,
            min_pixels=IMAGE_MIN_PIXELS,
            max_pixels=art.max_pixels,
            patch_size=art.patch_size,
            merge_size=art.merge_size,
        )
        landed = select_bucket(geo.patches, art.buckets)
        if landed != bucket:
            notes.append(f"bucket {bucket}: the processor's minimum size puts every image in bucket {landed}")
            continue
        if geo.lm_tokens + input_len + output_len + PROMPT_MARGIN > art.cfg["max_seq_len"]:
            notes.append(f"bucket {bucket}: {geo.lm_tokens} image tokens + the text do not fit max_seq_len")
            continue
        sizes.append((side, bucket, geo.lm_tokens))
    return sizes, notes


BENCH_OWNED = {
    "--host": "qvl bench-serve --host",
    "--port": "qvl bench-serve --port",
    "--model": "qvl bench-serve --served-model-name",
    "--max-concurrency": "the compiled batch_size (qvl sets it)",
    "--backend": "nothing (qvl benchmarks the chat endpoint)",
    "--endpoint": "nothing (qvl benchmarks the chat endpoint)",
    "--dataset-name": "nothing (qvl benchmarks random-mm)",
    "--tokenizer": "nothing (the tokenizer is DIR's)",
    "--num-prompts": "qvl bench-serve --num-prompts",
    "--random-input-len": "qvl bench-serve --input-len",
    "--random-output-len": "qvl bench-serve --output-len",
    "--seed": "qvl bench-serve --seed",
    "--random-mm-bucket-config": "nothing (qvl sizes the images to the compiled ViT buckets)",
}


def bench_command(opts: BenchOptions) -> tuple[Launch, list[str]]:
    """``vllm bench serve`` (vLLM's own load test) against ``qvl serve``, images sized to the compiled buckets."""
    directory, warnings = resolve_directory(opts.directory, opts.preset, "bench-serve")
    art = preflight(directory, verify_hashes=False)
    checks = list(art.checks)
    for flag, value, _, _ in parse_flags(opts.extra):
        base = flag.split(".", 1)[0]
        if base in BENCH_OWNED:
            raise _refuse(flag, value, "is set by qvl bench-serve", f"use {BENCH_OWNED[base]}")
    sizes, notes = bench_images(art, opts.input_len, opts.output_len)
    if not sizes:
        raise InputError(
            f"no compiled ViT bucket takes a benchmark image with --input-len {opts.input_len} and --output-len "
            f"{opts.output_len} within max_seq_len {art.cfg['max_seq_len']} ({'; '.join(notes)})",
            "lower --input-len / --output-len",
        )
    share = round(1.0 / len(sizes), 6)
    bucket_config = "{" + ", ".join(f"({side}, {side}, 1): {share}" for side, _, _ in sizes) + "}"
    _ok(
        checks,
        "image sizes",
        "; ".join(f"{side}x{side} -> bucket {bucket} ({tokens} tokens)" for side, bucket, tokens in sizes)
        + (f"; left out: {'; '.join(notes)}" if notes else ""),
    )
    _ok(checks, "max_concurrency", f"{art.cfg['batch_size']} (the compiled batch_size)")
    pairs = [
        ("--backend", "openai-chat"),
        ("--endpoint", "/v1/chat/completions"),
        ("--dataset-name", "random-mm"),
        ("--host", opts.host),
        ("--port", str(opts.port)),
        ("--model", opts.served_model_name or _served_name(art)),
        ("--tokenizer", str(art.root)),
        ("--max-concurrency", str(art.cfg["batch_size"])),
        ("--num-prompts", str(opts.num_prompts)),
        ("--random-input-len", str(opts.input_len)),
        ("--random-output-len", str(opts.output_len)),
        ("--random-mm-base-items-per-request", "1"),
        ("--random-mm-num-mm-items-range-ratio", "0"),
        ("--random-mm-limit-mm-per-prompt", json.dumps({"image": 1, "video": 0})),
        ("--random-mm-bucket-config", bucket_config),
        ("--seed", str(opts.seed)),
    ]
    argv = ["vllm", "bench", "serve", *(word for pair in pairs for word in pair), *opts.extra]
    return Launch(argv=argv, env={}, checks=checks), warnings


# ----------------------------------------------------------------------------------------------- exec


def find_vllm(env: Mapping[str, str]) -> str:
    """The ``vllm`` executable on the PATH the child will see; DependencyMissing (exit 3) when there is none."""
    found = shutil.which("vllm", path=env.get("PATH", ""))
    if found is None:
        raise DependencyMissing("`vllm` is not on PATH, so nothing was started", VLLM_INSTALL_HINT)
    return found
