"""What ``qvl infer`` runs: the directory, its backend and plan, the compiled values, conflicts and placement.

Its own module, apart from the run itself (``inference.runner``): all of it is decided from the directory, the
preset and ``--set`` alone, no request, and ``load-check`` and ``serve`` share its default-directory rule.

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
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.inference.agreement import conflict, disagreements
from qwenvl_rbln.paths import user_path

if TYPE_CHECKING:
    from qwenvl_rbln.artifacts.processor_files import Reader

DEFAULT_PRESET = "rebel100-1npu"
TINY_PRESET = "cpu-tiny"  # default for a plain tiny-model directory (rebel100-1npu's 262144 tokens do not fit it)


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
    from qwenvl_rbln.backends.tiny.model import is_tiny_model
    from qwenvl_rbln.planning.catalogue.modelinfo import TINY_MODELS

    if is_tiny_model(directory):
        return True
    model = (manifest or {}).get("model") or {}
    if model.get("id") in TINY_MODELS:
        return True
    local = model.get("local_path")
    return bool(local) and is_tiny_model(Path(local))


def _qwen3_vl_config(directory: Path) -> None:
    """InputError (one line) unless ``directory/config.json`` is a Qwen3-VL config."""
    from qwenvl_rbln.planning.catalogue.modelinfo import read_model_config

    try:
        read_model_config(directory)
    except InputError as exc:
        raise InputError(
            exc.message,
            "qvl infer runs Qwen3-VL: pass the directory `qvl compile` wrote, or a "
            "Hugging Face Qwen3-VL model directory",
        ) from None


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
    from qwenvl_rbln.planning.presets import PROCESSOR_KEYS

    proc = (manifest or {}).get("processor")
    out = []
    for key in PROCESSOR_KEYS if isinstance(proc, dict) else ():
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
    from qwenvl_rbln.artifacts.last_compile import last_compile

    return last_compile(require_dir=False)


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
    from qwenvl_rbln.artifacts.manifest import RBLN_CONFIG_NAME, TORCH_CONFIG_NAME
    from qwenvl_rbln.planning.plan import build_plan

    if not (directory / "config.json").is_file():
        raise InputError(
            f"{directory} is neither a qvl artifact nor a Hugging Face model directory "
            f"(no {TORCH_CONFIG_NAME}, {RBLN_CONFIG_NAME} or config.json)",
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


def _artifact_target(directory: Path, kind: str, preset: str | None, sets: list[str], fallback: str | None) -> Target:
    from qwenvl_rbln.artifacts.checked import read_artifact
    from qwenvl_rbln.artifacts.layout import check_layout, describe_layout_problem, resolved_from_rbln_config
    from qwenvl_rbln.artifacts.manifest import RBLN_CONFIG_NAME, TORCH_CONFIG_NAME

    art = read_artifact(directory)  # config, manifest and the small JSON files, read once for every check below
    cfg, manifest = art.cfg, art.manifest
    _qwen3_vl_config(directory)  # the artifact's config.json must be a Qwen3-VL config
    source = directory / (RBLN_CONFIG_NAME if kind == "rbln" else TORCH_CONFIG_NAME)
    resolved = resolved_from_rbln_config(cfg, source=str(source))
    preset_ref = preset or _manifest_preset(manifest) or fallback or DEFAULT_PRESET
    try:
        base = artifact_sets(directory, preset_ref, resolved, manifest)
    except InputError:
        if not preset:
            raise
        base = compiled_sets(resolved)  # an explicit preset does not use them: only the recompile hint does
    plan = _artifact_plan(directory, preset_ref, [] if preset else base, sets)
    baseline = None if preset else (_artifact_plan(directory, preset_ref, base, []).resolved if sets else plan.resolved)
    diffs = disagreements(resolved, plan.resolved, baseline)
    if diffs:  # every compiled key, not only the batch: the compiled graphs would silently win
        raise conflict(directory, resolved, plan, diffs, preset is not None, sets)
    warnings: list[str] = []
    # files present; hashes are load-check's job. Processor files saved outside qvl (the checkpoint's caps) do not
    # stop infer: it applies the plan's caps to the processor it loads (inputs.apply_caps), so it says so instead.
    layout = check_layout(directory, kind, cfg, None, processor=False, read=art.read)
    if layout["missing"] or layout["problems"]:
        raise InputError(
            f"{directory}: {describe_layout_problem({**layout, 'unexpected': [], 'modified': []})}",
            "`qvl load-check DIR` lists every problem; recompile with `qvl compile --force`",
        )
    warnings += _processor_file_warnings(directory, kind, cfg, plan, art.read)
    check_model_files(directory)
    tiny = _is_tiny(directory, manifest)
    return Target(directory, kind, kind, plan, resolved, manifest, cfg, tiny, warnings, artifact_sets=base)


def _processor_file_warnings(
    directory: Path, kind: str, cfg: dict[str, Any], plan: Any, read: Reader | None = None
) -> list[str]:
    """One warning when the artifact's processor files let inputs exceed its buckets: infer caps them anyway."""
    from qwenvl_rbln.artifacts.layout import processor_problems

    if kind != "rbln" or not processor_problems(directory, cfg, None, read=read):
        return []
    caps = plan.processor
    frame = getattr(caps, "video_max_frame_pixels", None)
    return [
        f"{directory}: its processor files let inputs exceed the largest ViT bucket (saved outside qvl?); infer "
        f"applies the plan's caps itself (images <= {caps.max_pixels:,} px"
        + (f", video frames <= {frame:,} px" if frame else "")
        + f"); `qvl fix-processor {directory}` makes every other loader safe too (`qvl load-check` lists the keys)"
    ]


def resolve_target(directory: Path | None, preset: str | None, sets: list[str] | None = None) -> Target:
    """The directory to run, its backend and the plan; InputError for anything that cannot run."""
    from qwenvl_rbln.artifacts.layout import artifact_kind

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
    kind = artifact_kind(directory)
    if kind is None:
        target = _hf_target(directory, preset or fallback, sets)
    else:
        target = _artifact_target(directory, kind, preset, sets, fallback)
    target.warnings[:0] = notes
    return target


def resolve_placement(target: Target, device: Any, visual_device: Any) -> dict[str, Any]:
    """The load placement for rbln: the flags, else the manifest's, else the preset's (as load-check)."""
    from qwenvl_rbln.artifacts.layout import compile_target
    from qwenvl_rbln.memory.placement import check_placement

    fallback = {"preset": target.plan.preset, "placement": target.plan.placement}
    compiled = compile_target(target.config or {}, target.manifest)
    placement = check_placement(device, visual_device, target.manifest, compiled, fallback)
    if not placement["ok"]:
        raise InputError(placement["problems"][0], "pass one device id per compiled device (num_devices)")
    return placement
