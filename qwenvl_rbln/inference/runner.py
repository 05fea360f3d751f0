"""``qvl infer`` end to end: requests -> artifact/plan -> vision report -> backend -> one result dict.

Order (nothing half-done): generation flags, then requests (flags or batch file), then every image/video
probed, then the artifact directory and its plan resolved and checked (Qwen3-VL, batch size, tokenizer
files), then the ViT buckets of every input decided (oversize resize/error), prompt lengths bounded,
every image and sampled video frame decoded, the torch device checked, and only then is a model loaded.

Which directory and which plan:

* ``DIR`` given and written by ``qvl compile`` (``qvl-rbln-config.json`` for backend torch,
  ``rbln_config.json`` for rbln): the backend is the artifact's; batch size, decoder graphs and ViT buckets
  are read from the artifact's own config (the compiled truth). Without ``--preset``, the plan is the
  preset recorded in its ``qvl-manifest.json`` (else rebel100-1npu) with the artifact's compiled values and
  recorded processor caps applied as if given with ``--set`` (so an artifact compiled with ``--set
  batch_size=1`` runs as it is), then the user's ``--set``. An explicit ``--preset`` or ``--set`` whose
  batch_size or decoder_batch_sizes differ from the artifact's is an error whose fix names the exact ``--set``.
* ``DIR`` given and a plain Hugging Face Qwen3-VL directory: the reference backend on it, with the preset's
  caps, batch size and buckets (default preset: cpu-tiny for the tiny model, else rebel100-1npu).
* no ``DIR`` and no ``--preset``: the directory the last ``qvl compile`` wrote (its manifest's preset); when
  that directory is gone, the output_dir of the preset that compile used; with no compile recorded,
  rebel100-1npu's output_dir.
* no ``DIR`` with ``--preset P``: P's ``output_dir`` (where ``qvl compile --preset P`` writes).
"""

from __future__ import annotations

import json
import math
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError, raise_all
from qwenvl_rbln.paths import user_path

DEFAULT_PRESET = "rebel100-1npu"
TINY_PRESET = "cpu-tiny"  # default for a plain tiny-model directory (rebel100-1npu's 262144 tokens do not fit it)
TINY_NOTICE = "qvl tiny model (random weights): the generated text is meaningless; it exercises every code path"


def _compiled_packing(target: Any) -> bool:
    """A compile's own runtime.vit_packing (recorded in its manifest, e.g. from --set) still holds at infer."""
    runtime = (target.manifest or {}).get("runtime")
    return not (isinstance(runtime, dict) and runtime.get("vit_packing") is False)


@dataclass
class Target:
    directory: Path
    kind: str  # "torch" | "rbln" (qvl artifacts) | "hf" (a plain Hugging Face directory)
    backend: str  # "torch" | "rbln"
    plan: Any
    resolved: Any  # plan.ResolvedLM of what was compiled
    manifest: dict[str, Any] | None
    config: dict[str, Any] | None
    tiny: bool
    warnings: list[str] = field(default_factory=list)
    artifact_sets: list[str] = field(default_factory=list)  # --set values that reproduce the compiled artifact

    def recompile(self, extra_set: str) -> str:
        """The `qvl compile` that rebuilds this artifact with ``--set extra_set``."""
        return recompile_command(self, [extra_set])


@dataclass
class InferOptions:
    directory: Path | None = None
    preset: str | None = None
    sets: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    videos: list[str] = field(default_factory=list)
    prompt: str | None = None
    system: str | None = None
    batch_file: Path | None = None
    max_new_tokens: int = 64
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    device: Any = None
    visual_device: Any = None
    on_oversize: str = "resize"
    torch_device: str | None = None
    emulate: bool = False  # --emulate: rbln artifacts run on qvl's CPU emulator of rebel (also QVL_EMULATE_NPU=1)
    vit_packing: bool = True  # --no-vit-packing; the preset's runtime.vit_packing: false also turns it off


def _manifest_preset(manifest: dict[str, Any] | None) -> str | None:
    """The preset an artifact was compiled with: its name when that names the same file, else its path."""
    from qwenvl_rbln.planning.presets import list_preset_files

    info = (manifest or {}).get("preset")
    if not isinstance(info, dict):
        return None
    name, path = info.get("name"), info.get("path")
    known = list_preset_files()
    if isinstance(name, str) and name in known and (not path or Path(path).resolve() == known[name].resolve()):
        return name
    stem = Path(name).stem if isinstance(name, str) else None
    if stem in known and isinstance(path, str) and Path(path).resolve() == known[stem].resolve():
        return stem
    if isinstance(path, str) and Path(path).is_file():
        return path
    return name if isinstance(name, str) and name else None


def _is_tiny(directory: Path, manifest: dict[str, Any] | None) -> bool:
    from qwenvl_rbln.backends.tiny_model import is_tiny_model
    from qwenvl_rbln.planning.modelinfo import TINY_MODEL_ID

    if is_tiny_model(directory):
        return True
    model = (manifest or {}).get("model") or {}
    if model.get("id") == TINY_MODEL_ID:
        return True
    local = model.get("local_path")
    return bool(local) and is_tiny_model(Path(local))


def _qwen3_vl_config(directory: Path) -> None:
    """InputError (one line) unless ``directory/config.json`` is a Qwen3-VL config."""
    from qwenvl_rbln.planning.modelinfo import read_model_config

    try:
        read_model_config(directory)
    except InputError as exc:
        raise InputError(
            exc.message,
            "qvl infer runs Qwen3-VL: pass the directory `qvl compile` wrote, or a "
            "Hugging Face Qwen3-VL model directory",
        ) from None


CAP_KEYS = ("min_pixels", "max_pixels", "video_min_pixels", "video_max_pixels", "fps", "min_frames", "max_frames")


def _list_arg(values: list[int]) -> str:
    """A list as --set takes it: JSON without spaces, so the shell keeps it one argument."""
    return "[" + ",".join(str(v) for v in values) + "]"


def _lm_sets(resolved: Any) -> list[str]:
    return [
        f"batch_size={resolved.batch_size}",
        f"decoder_batch_sizes={_list_arg(list(resolved.decoder_batch_sizes))}",
    ]


def compiled_sets(resolved: Any) -> list[str]:
    """The artifact's batch size, decoder graphs and ViT buckets as --set."""
    return [*_lm_sets(resolved), f"visual.max_seq_len={_list_arg(sorted(resolved.vit_buckets))}"]


def processor_sets(manifest: dict[str, Any] | None, derived: Any) -> list[str]:
    """The processor caps recorded at compile that differ from ``derived`` (what the buckets imply) as --set.

    Caps that merely follow the buckets are left out, so a recompile with a larger bucket raises them too.
    """
    proc = (manifest or {}).get("processor")
    out = []
    for key in CAP_KEYS if isinstance(proc, dict) else ():
        value = proc.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value != getattr(derived, key, None):
            out.append(f"processor.{key}={json.dumps(value)}")
    return out


def artifact_sets(directory: Path, preset_ref: str, resolved: Any, manifest: dict[str, Any] | None) -> list[str]:
    """The artifact's compiled values and compile-time processor caps as --set on ``preset_ref``, so it runs as
    compiled without the user repeating them; InputError when they do not make a valid plan of that preset."""
    from qwenvl_rbln.planning.plan import build_plan

    lm = compiled_sets(resolved)
    try:
        derived = build_plan(preset_ref, lm, model=str(directory)).processor
    except InputError as exc:
        raise InputError(
            f"{directory}: cannot run it with preset {preset_ref} and its compiled values ({exc.message})",
            f"pass the preset it was compiled with (--preset P); {exc.hint or ''}".rstrip("; "),
        ) from None
    return lm + processor_sets(manifest, derived)


def _set_key(item: str) -> str:
    return item.split("=", 1)[0].strip().removeprefix("rbln_config.")


def without_overridden(base: list[str], sets: list[str]) -> list[str]:
    """``base`` less the keys the user's ``sets`` give."""
    given = {_set_key(s) for s in sets}
    return [b for b in base if _set_key(b) not in given]


def _set_value(plan: Any, item: str) -> Any:
    """The plan's value for the key of ``key=value`` (None when the key is not one qvl sets here)."""
    key = item.split("=", 1)[0]
    if key.startswith("processor."):
        return getattr(plan.processor, key.split(".", 1)[1], None)
    return {
        "batch_size": plan.resolved.batch_size,
        "decoder_batch_sizes": _list_arg(list(plan.resolved.decoder_batch_sizes)),
        "visual.max_seq_len": _list_arg(sorted(plan.resolved.vit_buckets)),
    }.get(key)


def _differs(plan: Any, item: str) -> bool:
    raw = item.split("=", 1)[1]
    current = _set_value(plan, item)
    return str(current) != raw and json.dumps(current) != raw


def recompile_command(target: Target, extra_sets: list[str]) -> str:
    """`qvl compile` of the artifact's preset, the --set it was compiled with beyond it, then ``extra_sets``."""
    from qwenvl_rbln.planning.plan import build_plan

    keys = {s.split("=", 1)[0] for s in extra_sets}
    sets = [s for s in target.artifact_sets if s.split("=", 1)[0] not in keys]
    try:
        bare = build_plan(target.plan.preset, model=str(target.directory))
        sets = [s for s in sets if _differs(bare, s)]
    except Exception:  # noqa: BLE001 - a hint only: then every compiled value is spelled out
        pass
    args = " ".join(f"--set {s}" for s in [*sets, *extra_sets])  # JSON without spaces: one shell word each
    out = shlex.quote(str(target.directory))
    return f"qvl compile --preset {shlex.quote(target.plan.preset)} {args} -o {out} --force"


def _last_compile_record() -> dict[str, str] | None:
    """The last compile's {output_dir, preset}, even when that directory has been deleted since."""
    from qwenvl_rbln import artifacts

    return artifacts.last_compile(require_dir=False)


def _preset_output_dir(preset: str, sets: list[str]) -> Path:
    from qwenvl_rbln.planning.plan import build_plan

    return user_path(build_plan(preset, sets).output_dir, "output_dir")


def default_directory(
    preset: str | None, sets: list[str], command: str = "infer"
) -> tuple[Path, str | None, list[str]]:
    """(directory, the preset to fall back on, warnings) when no DIR is given: the one rule `infer` and
    `load-check` share (``command`` only names the one that asked, in the fixes).

    ``--preset P``: P's output_dir. Else the directory the last ``qvl compile`` run from this working directory
    wrote; when it is gone, the output_dir of the preset that compile used (never an unrelated default); with no
    compile recorded here, rebel100-1npu's.
    """
    record = None if preset is not None else _last_compile_record()
    if record and Path(record["output_dir"]).is_dir():
        return Path(record["output_dir"]), record["preset"], []
    name = preset or (record["preset"] if record else DEFAULT_PRESET)
    directory = _preset_output_dir(name, sets)
    if record:
        gone = f"the last `qvl compile` wrote {record['output_dir']} (preset {name}), which no longer exists"
        if not directory.is_dir():
            raise InputError(
                f"no artifacts: {gone}, and neither does {directory} (preset {name}'s output_dir)",
                f"compile again: `qvl compile --preset {name}`, or pass the artifact directory: "
                f"`qvl {command} DIR ...`",
            )
        return directory, name, [f"{gone}: running {directory} (preset {name}'s output_dir)"]
    if not directory.exists():
        raise InputError(
            f"no artifacts at {directory} (the output_dir of preset {name})",
            f"compile them first: `qvl compile --preset {name}`, or pass the artifact directory: "
            f"`qvl {command} DIR ...`",
        )
    return directory, name, []


MODEL_FILE_GROUPS = (
    (("processor_config.json",), ("preprocessor_config.json",)),
    (("tokenizer.json",), ("vocab.json", "merges.txt")),
)


def check_model_files(directory: Path) -> None:
    """InputError naming ``directory`` when its processor or tokenizer files are missing (checked before loading).

    transformers would build a one-token tokenizer instead and fail at the first image with a token-count
    mismatch; the loaders also check the vision tokens themselves (``inputs.check_processor``).
    """
    from qwenvl_rbln.inference.inputs import TOKENIZER_HINT

    for group in MODEL_FILE_GROUPS:
        if not any(all((directory / name).is_file() for name in option) for option in group):
            wanted = " or ".join(" and ".join(option) for option in group)
            raise InputError(f"{directory}: no {wanted} (the Qwen3-VL processor cannot be built)", TOKENIZER_HINT)


def _hf_target(directory: Path, preset: str | None, sets: list[str]) -> Target:
    from qwenvl_rbln import artifacts
    from qwenvl_rbln.planning.plan import build_plan

    if not (directory / "config.json").is_file():
        raise InputError(
            f"{directory} is neither a qvl artifact nor a Hugging Face model directory "
            f"(no {artifacts.TORCH_CONFIG_NAME}, {artifacts.RBLN_CONFIG_NAME} or config.json)",
            "pass the directory `qvl compile` wrote, or a Qwen3-VL model directory",
        )
    _qwen3_vl_config(directory)  # not qwen3_vl -> one clear line
    check_model_files(directory)
    tiny = _is_tiny(directory, None)
    plan = build_plan(preset or (TINY_PRESET if tiny else DEFAULT_PRESET), sets, model=str(directory))
    warnings = []
    if plan.backend == "rbln":
        warnings.append(
            f"{directory} is a Hugging Face directory, not compiled artifacts: running the torch reference "
            f"backend with preset {plan.preset}'s batch size, buckets and pixel caps"
        )
    return Target(directory, "hf", "torch", plan, plan.resolved, None, None, tiny, warnings)


def _artifact_plan(directory: Path, preset_ref: str, base: list[str], sets: list[str]) -> Any:
    """The plan of ``preset_ref`` with the artifact's own values (``base``), then the user's ``sets``.

    When the user's values do not combine with the artifact's (``--set batch_size=4`` against compiled
    ``decoder_batch_sizes=[1]``), the plan is the preset with the user's values alone, for the conflict
    check to name.
    """
    from qwenvl_rbln.planning.plan import build_plan

    try:
        return build_plan(preset_ref, without_overridden(base, sets) + sets, model=str(directory))
    except InputError:
        if not base or not sets:
            raise
    return build_plan(preset_ref, sets, model=str(directory))


def _conflict(directory: Path, resolved: Any, plan: Any, explicit_preset: bool, sets: list[str]) -> InputError:
    """An explicit --preset/--set disagrees with the compiled batch: the exact --set that would agree."""
    pr = plan.resolved
    exact = " ".join(f"--set {s}" for s in _lm_sets(resolved))
    drop = " and ".join(
        ([f"--preset {plan.preset}"] if explicit_preset else []) + (["the --set that change them"] if sets else [])
    )
    return InputError(
        f"{directory} was compiled for batch_size {resolved.batch_size} (decoder graphs "
        f"{resolved.decoder_batch_sizes}) but preset {plan.preset}{' with your --set' if sets else ''} says "
        f"batch_size {pr.batch_size} (decoder graphs {pr.decoder_batch_sizes})",
        f"drop {drop} (infer then uses the artifact's own values), or pass what it was compiled with: {exact}, "
        "or recompile for yours: "
        f"`qvl compile --preset {plan.preset}{''.join(f' --set {s}' for s in sets)} -o {directory} --force`",
    )


def _artifact_target(directory: Path, kind: str, preset: str | None, sets: list[str], fallback: str | None) -> Target:
    from qwenvl_rbln import artifacts

    _, cfg = artifacts.read_artifact_config(directory)
    manifest = artifacts.read_manifest(directory)
    _qwen3_vl_config(directory)  # the artifact's config.json must be a Qwen3-VL config
    source = directory / (artifacts.RBLN_CONFIG_NAME if kind == "rbln" else artifacts.TORCH_CONFIG_NAME)
    resolved = artifacts.resolved_from_rbln_config(cfg, source=str(source))
    preset_ref = preset or _manifest_preset(manifest) or fallback or DEFAULT_PRESET
    try:
        base = artifact_sets(directory, preset_ref, resolved, manifest)
    except InputError:
        if not preset:
            raise
        base = compiled_sets(resolved)  # an explicit preset does not use them: only the recompile hint does
    plan = _artifact_plan(directory, preset_ref, [] if preset else base, sets)
    pr = plan.resolved
    if resolved.batch_size != pr.batch_size or sorted(resolved.decoder_batch_sizes) != sorted(pr.decoder_batch_sizes):
        raise _conflict(directory, resolved, plan, preset is not None, sets)
    warnings = []
    if sorted(resolved.vit_buckets) != sorted(pr.vit_buckets):
        warnings.append(
            f"{directory} was compiled with ViT buckets {resolved.vit_buckets}, preset {plan.preset} says "
            f"{pr.vit_buckets}: using the compiled ones"
        )
    layout = artifacts.check_layout(directory, kind, cfg, None)  # files present; hashes are load-check's job
    if layout["missing"] or layout["problems"]:
        raise InputError(
            f"{directory}: {artifacts.describe_layout_problem({**layout, 'unexpected': [], 'modified': []})}",
            "`qvl load-check DIR` lists every problem; recompile with `qvl compile --force`",
        )
    check_model_files(directory)
    tiny = _is_tiny(directory, manifest)
    return Target(directory, kind, kind, plan, resolved, manifest, cfg, tiny, warnings, artifact_sets=base)


def resolve_target(directory: Path | None, preset: str | None, sets: list[str] | None = None) -> Target:
    """The directory to run, its backend and the plan; InputError for anything that cannot run."""
    from qwenvl_rbln import artifacts

    sets = list(sets or [])
    fallback, notes = None, []
    if directory is None:
        directory, fallback, notes = default_directory(preset, sets)
        if preset is not None:
            fallback = None  # an explicit --preset stays explicit
    directory = user_path(directory).absolute()
    if not directory.is_dir():
        what = "does not exist" if not directory.exists() else "is not a directory"
        raise InputError(f"{directory} {what}", "pass the directory `qvl compile` wrote, or a Qwen3-VL model directory")
    kind = artifacts.artifact_kind(directory)
    if kind is None:
        target = _hf_target(directory, preset or fallback, sets)
    else:
        target = _artifact_target(directory, kind, preset, sets, fallback)
    target.warnings[:0] = notes
    return target


def resolve_placement(target: Target, device: Any, visual_device: Any) -> dict[str, Any]:
    """The load placement for rbln: the flags, else the manifest's, else the preset's (as load-check)."""
    from qwenvl_rbln import artifacts
    from qwenvl_rbln.memory.placement import check_placement

    fallback = {"preset": target.plan.preset, "placement": target.plan.placement}
    compiled = artifacts.compile_target(target.config or {}, target.manifest)
    placement = check_placement(device, visual_device, target.manifest, compiled, fallback)
    if not placement["ok"]:
        raise InputError(placement["problems"][0], "pass one device id per compiled device (num_devices)")
    return placement


def _decoder_info(real: int, resolved: Any) -> dict[str, Any]:
    from qwenvl_rbln.vision.buckets import select_decoder_graph

    bs = resolved.batch_size
    vgraph, vpad = select_decoder_graph(real, resolved.decoder_batch_sizes)
    return {
        "decoder_graph": f"decoder_batch_{bs}",
        "graph_batch": bs,
        "real_rows": real,
        "padded_rows": bs - real,
        "vllm_rbln_graph": f"decoder_batch_{vgraph}",
        "vllm_rbln_padded_rows": vpad,
    }


def _memory(backend: Any, target: Target, placement: dict[str, Any] | None) -> dict[str, Any]:
    if target.backend == "torch":
        return backend.memory()
    from qwenvl_rbln.memory import planner

    try:
        report = planner.estimate(
            target.plan.geometry, target.resolved, target.plan.npu_spec, placement["requested"], dtype_bytes=2
        ).to_dict()
    except Exception as exc:  # noqa: BLE001 - memory figures must never fail a finished run
        return {"source": "unavailable", "reason": str(exc)}
    return {
        "source": "planner estimate",
        "fits": report.get("fits"),
        "devices": [
            {
                "device": d["device"],
                "total_bytes": d["total_bytes"],
                "usable_bytes": d["usable_bytes"],
                "fits": d["fits"],
            }
            for d in report.get("devices") or []
        ],
    }


def collect_requests(opts: InferOptions) -> list[Any]:
    from qwenvl_rbln.inference.requests import from_flags, parse_batch_file, validate_requests

    if opts.batch_file is not None:
        mixed = [f for f, v in (("--prompt", opts.prompt), ("--image", opts.images), ("--video", opts.videos)) if v]
        if mixed:
            raise InputError(
                f"--batch-file cannot be combined with {', '.join(mixed)}",
                "put every request in the batch file (keys prompt, images, video), or drop --batch-file",
            )
        problems: list[InputError] = []  # every bad line of the file, in line order, reported at once
        parsed = parse_batch_file(opts.batch_file, default_system=opts.system, problems=problems)
        requests = validate_requests(parsed, problems)
        fix = "correct each line listed; nothing ran"
        raise_all(sorted(problems, key=_line_number), f"bad lines in {opts.batch_file}", fix)
        return requests
    return validate_requests(from_flags(opts.prompt, opts.images, opts.videos, opts.system))


def _line_number(exc: InputError) -> int:
    """The line a batch-file problem names (``file:12: ...``), for reporting them in file order."""
    import re

    match = re.search(r":(\d+): ", exc.message)
    return int(match.group(1)) if match else 0


def check_prompt_room(requests: list[Any], vplan: Any, max_new_tokens: int, max_seq_len: int, processor: Any) -> None:
    """Refuse, before any model loads, a request whose prompt + ``max_new_tokens`` exceeds ``max_seq_len``.

    ``processor`` (tokenizer and chat template: no weights) counts each prompt exactly as
    ``inputs.build_inputs`` will (``inputs.prompt_tokens``, with the vision plan's token counts), so the
    limit the refusal names is the real one. ``generation.check_lengths`` checks the processor's own count
    again per batch, before generate.
    """
    from qwenvl_rbln.inference.generation import length_error
    from qwenvl_rbln.inference.inputs import prompt_tokens
    from qwenvl_rbln.inference.requests import FLAGS_SOURCE

    problems: list[InputError] = []  # every request that does not fit, reported together
    for req in requests:
        items = vplan.items[req.id]
        try:
            n = prompt_tokens(processor, req, items, req.caps or vplan.caps)
        except InputError as exc:
            prefix = "" if req.source == FLAGS_SOURCE else f"{req.source}: "
            problems.append(InputError(prefix + exc.message, exc.hint))
            continue
        if n + max_new_tokens > max_seq_len:
            problems.append(length_error(req, n, max_new_tokens, max_seq_len, sum(it.lm_tokens for it in items)))
    raise_all(problems, "requests do not fit max_seq_len", "correct each one listed; nothing ran")


def _prepare(opts: InferOptions, target: Target, requests: list[Any], gen: Any) -> tuple[Any, list[str]]:
    """Everything decided before a model loads: the vision plan, per-request caps, decodable media, lengths.

    The prompt lengths are counted with the directory's processor (tokenizer and chat template, no weights),
    so a --max-new-tokens that does not fit is refused with the exact limit before a model loads.
    """
    from qwenvl_rbln.inference.inputs import check_media, load_processor
    from qwenvl_rbln.inference.vision_report import plan_vision
    from qwenvl_rbln.planning.modelinfo import processor_defaults

    vis = target.plan.geometry.vision
    vplan = plan_vision(
        requests,
        target.plan.processor,
        target.resolved.vit_buckets,
        on_oversize=opts.on_oversize,
        patch_size=vis.patch_size,
        merge_size=vis.spatial_merge_size,
        temporal_patch_size=vis.temporal_patch_size,
        recompile=None if target.kind == "hf" else target.recompile,
        stock=processor_defaults(target.plan.model_id),
    )
    for req in requests:
        req.caps = vplan.request_caps[req.id]
    check_media(requests, vplan.caps)
    processor = load_processor(target.directory, vplan.caps)
    check_prompt_room(requests, vplan, gen.max_new_tokens, target.resolved.max_seq_len, processor)
    warnings = list(target.warnings) + gen.warnings() + vplan.notes
    return vplan, warnings


def _torch_device(opts: InferOptions, target: Target, warnings: list[str]) -> str | None:
    """The torch device, checked against the machine before loading (None on rbln, where it is ignored)."""
    if target.backend != "torch":
        if opts.torch_device is not None:
            warnings.append("--torch-device applies to the torch reference backend; the rbln backend ignores it")
        return None
    from qwenvl_rbln.inference.reference import torch_device

    return torch_device(opts.torch_device)


def _emulation(opts: InferOptions, target: Target) -> bool:
    """Activate qvl's CPU emulator for an rbln artifact when asked; refuse what it cannot or must not run."""
    from qwenvl_rbln.backends import rbln as rbln_backend

    if target.backend != "rbln":
        if opts.emulate:
            raise InputError(
                f"--emulate emulates the NPU backend, but {target.directory} runs on the torch reference backend "
                f"(preset {target.plan.preset}; nothing to emulate)",
                "drop --emulate, or run an artifact compiled with `qvl compile --preset cpu-tiny-rbln --emulate`",
            )
        return False
    emulated = rbln_backend.use_emulator(opts.emulate)
    graphs = artifacts_graphs(target)
    problem = rbln_backend.artifact_problem(target.directory, target.config or {}, target.manifest, graphs)
    if problem is not None:
        raise problem
    return emulated


def artifacts_graphs(target: Target) -> dict[str, dict[str, str]]:
    from qwenvl_rbln import artifacts

    return artifacts.graph_files(target.config or {})


@dataclass
class _Run:
    """Everything ``run_infer`` decided before a model loads (``warnings`` grows as batches run)."""

    gen: Any  # generation.GenerationOptions
    requests: list[Any]
    target: Target
    emulated: bool
    vplan: Any  # vision_report.VisionPlan
    warnings: list[str]
    placement: dict[str, Any] | None
    torch_dev: str | None


def _plan_run(opts: InferOptions) -> _Run:
    """Flags, requests, directory and plan, emulation, vision plan and lengths, placement, torch device:
    every refusal, in this order, before any model loads."""
    from qwenvl_rbln.inference.generation import GenerationOptions
    from qwenvl_rbln.inference.reference import device_spelling

    gen = GenerationOptions(opts.max_new_tokens, opts.temperature, opts.top_p, opts.seed)
    device_spelling(opts.torch_device)
    requests = collect_requests(opts)
    target = resolve_target(opts.directory, opts.preset, opts.sets)
    emulated = _emulation(opts, target)
    vplan, warnings = _prepare(opts, target, requests, gen)
    placement = None
    if target.backend == "rbln":
        placement = resolve_placement(target, opts.device, opts.visual_device)
    elif opts.device is not None or opts.visual_device is not None:
        warnings.append("--device/--visual-device place NPU graphs; the torch reference backend ignores them")
    torch_dev = _torch_device(opts, target, warnings)
    return _Run(gen, requests, target, emulated, vplan, warnings, placement, torch_dev)


def _announce(run: _Run, notify: Any) -> None:
    """The warnings known before the model loads, the tiny-model notice first."""
    if notify is None:
        return
    for line in ([TINY_NOTICE] if run.target.tiny else []) + list(dict.fromkeys(run.warnings)):
        notify(line)


def _load_backend(opts: InferOptions, run: _Run, model_cls: Any) -> Any:
    """The torch reference model, or the compiled rbln artifact on its placement."""
    target = run.target
    if target.backend == "torch":
        from qwenvl_rbln.inference.reference import ReferenceBackend

        return ReferenceBackend(target.directory, run.vplan.caps, device=run.torch_dev)
    from qwenvl_rbln.inference.rbln_generate import RblnBackend

    req = run.placement["requested"]
    return RblnBackend(
        target.directory,
        run.vplan.caps,
        batch_size=target.resolved.batch_size,
        device=req["device"],
        visual_device=req["visual_device"],
        model_cls=model_cls,
        vit_packing=opts.vit_packing and target.plan.runtime.get("vit_packing", True) and _compiled_packing(target),
    )


def _grid_warnings(run: _Run, batch: list[Any], result: Any) -> list[str]:
    """The processor's real vision grids of a batch checked against the planned ViT buckets."""
    from qwenvl_rbln.inference.vision_report import check_grids

    vis = run.target.plan.geometry.vision
    items = [it for r in batch for it in run.vplan.items[r.id]]
    return check_grids(
        items,
        result.vision_grids["image"],
        result.vision_grids["video"],
        run.target.resolved.vit_buckets,
        patch_size=vis.patch_size,
        merge_size=vis.spatial_merge_size,
    )


def _request_entry(run: _Run, req: Any, row: Any, index: int, dec: dict[str, Any], result: Any) -> dict[str, Any]:
    """One request's row of the result: its text, tokens, vision items, caps, prefill and batch."""
    chunk = run.target.resolved.prefill_chunk_size
    return {
        "id": req.id,
        "source": req.source,
        "prompt": req.prompt,
        "system": req.system,
        "text": row.text,
        "token_ids": row.token_ids,
        "num_tokens": len(row.token_ids),
        "finish_reason": row.finish_reason,
        "streamed": row.streamed,
        "vision": [it.to_dict() for it in run.vplan.items[req.id]],
        "processor": run.vplan.request_caps[req.id].to_dict(),
        "prefill": {
            "tokens": row.prompt_tokens,
            "chunk_size": chunk,
            "chunks": math.ceil(row.prompt_tokens / chunk),
        },
        "batch": index,
        "decoder_graph": dec["decoder_graph"],
        "padded_rows": dec["padded_rows"],
        "timings": result.timings,
    }


def _run_batches(backend: Any, run: _Run, stream: Any, on_batch: Any) -> tuple[list[dict[str, Any]], list[dict]]:
    """Generate batch by batch: (one entry per request, one per batch); ``on_batch`` after each."""
    requests, resolved = run.requests, run.target.resolved
    bs = resolved.batch_size
    out_requests: list[dict[str, Any]] = []
    batches: list[dict[str, Any]] = []
    for index, start in enumerate(range(0, len(requests), bs)):
        batch = requests[start : start + bs]
        prefix = f"[{batch[0].id}] " if len(requests) > 1 else ""
        result = backend.run_batch(batch, run.gen, sink=stream, max_seq_len=resolved.max_seq_len, stream_prefix=prefix)
        run.warnings.extend(result.warnings)
        run.warnings.extend(_grid_warnings(run, batch, result))
        dec = _decoder_info(len(batch), resolved)
        batches.append(
            {
                "index": index,
                "request_ids": [r.id for r in batch],
                "input_rows": result.input_rows,
                **dec,
                "timings": result.timings,
                "vit": getattr(backend, "last_vit", None),  # rbln: graph calls and packs of this batch
            }
        )
        rows = [_request_entry(run, req, row, index, dec, result) for req, row in zip(batch, result.rows, strict=True)]
        out_requests.extend(rows)
        if on_batch is not None:
            on_batch(rows, batches[-1])
    return out_requests, batches


def _report(opts: InferOptions, run: _Run, backend: Any, ran: dict[str, Any]) -> dict[str, Any]:
    """The JSON-able result (``ran``: requests, batches, memory, load time and start of the finished run)."""
    target, vplan = run.target, run.vplan
    data: dict[str, Any] = {
        "backend": target.backend,
        "emulated": run.emulated,
        "artifact_dir": str(target.directory),
        "artifact_kind": target.kind,
        "preset": target.plan.preset,
        "tiny_model": target.tiny,
        "notice": TINY_NOTICE if target.tiny else None,
        "runtime": backend.describe(),
        "batch_size": target.resolved.batch_size,
        "decoder_batch_sizes": target.resolved.decoder_batch_sizes,
        "vit_buckets": target.resolved.vit_buckets,
        "max_seq_len": target.resolved.max_seq_len,
        "processor": vplan.caps.to_dict(),
        "oversize": {"policy": opts.on_oversize, "capped": vplan.capped, "notes": vplan.notes},
        "generation": run.gen.to_dict(),
        "requests": ran["requests"],
        "batches": ran["batches"],
        "timings": {"load_s": round(ran["load_s"], 4), "total_s": round(time.perf_counter() - ran["t_start"], 4)},
        "memory": ran["memory"],
        "warnings": list(dict.fromkeys(run.warnings)),
    }
    if run.placement is not None:
        data["placement"] = run.placement["requested"]
    return data


def run_infer(
    opts: InferOptions,
    *,
    stream: Any = None,
    on_batch: Any = None,
    notify: Any = None,
    model_cls: Any = None,
) -> dict[str, Any]:
    """Run ``qvl infer``; returns the JSON-able result.

    ``stream``: where the text of a one-request batch is streamed (None: no streaming);
    ``on_batch(rows, batch)`` is called after each batch (human output); ``notify(line)`` gets the
    warnings known before the model loads (the tiny-model notice first), so they show before any text.
    """
    t_start = time.perf_counter()
    run = _plan_run(opts)
    _announce(run, notify)
    t_load = time.perf_counter()
    backend = _load_backend(opts, run, model_cls)
    load_s = time.perf_counter() - t_load
    try:
        out_requests, batches = _run_batches(backend, run, stream, on_batch)
        memory = _memory(backend, run.target, run.placement)
    finally:
        backend.close()
    ran = {"requests": out_requests, "batches": batches, "memory": memory, "load_s": load_s, "t_start": t_start}
    return _report(opts, run, backend, ran)


def default_stream(as_json: bool) -> Any:
    """Streamed tokens: stdout for people, stderr in --json mode (stdout stays one JSON document)."""
    return sys.stderr if as_json else sys.stdout
