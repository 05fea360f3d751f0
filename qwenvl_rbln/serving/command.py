"""``vllm serve DIR ...``: the artifact directory, the NPU placement, the multimodal limits and the environment.

Device ids given to qvl are physical NPU ids; this module turns them into the device variable of the vllm-rbln
generation the line is for (``RBLN_DEVICES`` or ``RBLN_VISIBLE_DEVICES``, ``engine.py``) and the positions in it
that its placement flag carries, and decides ViT packing and the decode batch sort for the plugin.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwenvl_rbln.artifacts.layout import placement_from_artifact
from qwenvl_rbln.artifacts.manifest import MANIFEST_NAME
from qwenvl_rbln.errors import InputError
from qwenvl_rbln.paths import user_path
from qwenvl_rbln.planning.catalogue.multi_device import multi_device_refusal
from qwenvl_rbln.serving import emulated, resume_features
from qwenvl_rbln.serving.decode_sort import SORT_ENV, compiled_with_sort, needs_sort
from qwenvl_rbln.serving.engine import Engine, resolve
from qwenvl_rbln.serving.flags import check_pass_through, image_kwargs
from qwenvl_rbln.serving.options import (
    API_KEY_ENV,
    DEFAULT_HOST,
    DEFAULT_PORT,
    FRAME_CAP_ENV,
    KEY_GUARD,
    MAX_FRAME_PIXELS_ENV,
    PACKING_ENV,
    PLUGIN_GROUP,
    PLUGIN_NAME,
    REDACTED,
    USAGE_STATS_ENV,
    Artifact,
    Launch,
    ServeOptions,
    api_key,
    host_port,
    is_loopback,
    usage_stats_opted_in,
)
from qwenvl_rbln.serving.preflight import ok, preflight, warn
from qwenvl_rbln.serving.public_routes import GUARDED_EXAMPLES, PUBLIC_ROUTES
from qwenvl_rbln.serving.public_routes import describe as public_rule


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
            f"{flag}: the placement {value!r} (recorded in {MANIFEST_NAME}) is not an NPU id or a list of them",
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


def placement(
    art: Artifact, device: Any, visual_device: Any, preset_placement: dict | None, force: bool = False
) -> dict[str, Any]:
    """Requested LM/ViT devices (default: as compiled), the visible NPUs and the placement vllm-rbln reads (positions
    in that list); a submodule compiled for num_devices > 1 on a Rebel100 is refused unless ``force``."""
    recorded = placement_from_artifact(art.cfg, art.manifest)
    source = recorded.pop("source")
    if source != MANIFEST_NAME and preset_placement:
        recorded, source = dict(preset_placement), "the preset's placement"
    lm = device if device is not None else recorded["device"]
    if visual_device is not None:
        vis = visual_device
    elif device is None or recorded.get("visual_device") != recorded.get("device"):
        vis = recorded.get("visual_device", lm)
    else:
        vis = lm
    target = art.target
    refusal = multi_device_refusal(target["npu"], target["num_devices"], target["visual_num_devices"], "qvl serve")
    if refusal is not None and not force:
        raise refusal
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


def served_name(art: Artifact) -> str:
    model = (art.manifest or {}).get("model")
    ident = model.get("id") if isinstance(model, dict) else None
    if isinstance(ident, str) and re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", ident):
        return ident
    return art.root.name


def _name_source(art: Artifact, given: str | None) -> str:
    if given is not None:
        return "--served-model-name"
    if served_name(art) != art.root.name:
        return "the compiled model's hub id"
    return "the artifact folder's name: the compiled model's id is not a hub id; --served-model-name sets another"


def _preset_plan(preset: str | None) -> Any:
    if preset is None:
        return None
    from qwenvl_rbln.planning.plan import build_plan

    return build_plan(preset)


def limit_mm_per_prompt(art: Artifact, plan: Any) -> tuple[dict[str, int], str, list[str]]:
    """Items per prompt: the preset's ``runtime.limit_mm_per_prompt`` when it has one, else as many of the largest
    image (capped at the largest bucket) and of the largest video (the recorded processor caps) as fit the context
    with ``vision.context.RESERVE_TOKENS`` left for the template, the text and the output, in the compiled
    max_seq_len (the --max-model-len serve passes). The third value names each modality a context too small for one
    such item turns off (0), with its cause."""
    runtime = getattr(plan, "runtime", None) or (art.manifest or {}).get("runtime") or {}
    given = runtime.get("limit_mm_per_prompt") if isinstance(runtime, dict) else None
    if isinstance(given, dict) and given:
        return dict(given), "the preset's runtime.limit_mm_per_prompt", []
    from qwenvl_rbln.vision import context
    from qwenvl_rbln.vision.geometry import VIDEO_MAX_FRAMES, VIDEO_MAX_PIXELS

    caps = getattr(plan, "processor", None)
    caps = caps.to_dict() if caps is not None else (art.manifest or {}).get("processor") or {}
    caps = caps if isinstance(caps, dict) else {}
    video_pixels = caps.get("video_max_pixels")
    video_pixels = video_pixels if type(video_pixels) is int and video_pixels > 0 else VIDEO_MAX_PIXELS
    frames = caps.get("max_frames") if type(caps.get("max_frames")) is int else VIDEO_MAX_FRAMES
    fps = caps.get("fps") if isinstance(caps.get("fps"), int | float) and caps.get("fps") > 0 else 2.0
    context_len = art.cfg["max_seq_len"]  # the --max-model-len serve passes (preflight.check_kv_pool: it fits)
    length = f"max_seq_len {context_len}"
    image_tokens = context.image_tokens(art.buckets[-1] // art.merge_size**2)
    # the longest video: max_frames frames over the whole budget, one timestamp and delimiter pair per 2 frames
    pads = max(1, video_pixels // (2 * art.patch_size**2 * art.merge_size**2))
    video_tokens = context.video_tokens(pads, max(1, frames // 2), frames, fps)
    limits = {
        "image": context.items_per_context(image_tokens, context_len),
        "video": context.items_per_context(video_tokens, context_len),
    }
    room = context_len - context.RESERVE_TOKENS
    off = [
        f"limit_mm_per_prompt {kind} is 0: one {what} ({tokens} tokens) does not fit {length} less "
        f"the reserve of {context.RESERVE_TOKENS} for the template, text and output ({room}); vLLM will refuse every "
        f"{kind}. Fix: recompile with a larger max_seq_len, lower processor.{cap}, or set runtime.limit_mm_per_prompt"
        for kind, what, tokens, cap in (
            ("image", "image at the largest bucket", image_tokens, "max_pixels"),
            ("video", "video at the full budget", video_tokens, "video_max_pixels / max_frames"),
        )
        if limits[kind] == 0
    ]
    where = "the recorded processor caps" if caps else "the default video caps"
    source = (
        f"largest image ({image_tokens} tokens) and video ({video_tokens} tokens, {where}) per context less a reserve "
        f"of {context.RESERVE_TOKENS}, in {length}"
    )
    return limits, source, off


def _oversize_policy(art: Artifact, plan: Any) -> str:
    """What serving does with an input above the largest bucket, under the policy infer and bucket-plan follow."""
    policy = None
    for runtime in (getattr(plan, "runtime", None), (art.manifest or {}).get("runtime")):
        if isinstance(runtime, dict) and runtime.get("on_oversize"):
            policy = policy or runtime["on_oversize"]
    how = (
        "vLLM's processor resizes every image to the artifact's max_pixels and every video frame to its "
        "qvl_max_frame_pixels, both checked above to fit the largest bucket: no request reaches 'Required seq_len'"
    )
    if policy == "error":
        how += "; vLLM cannot refuse single inputs as `infer --on-oversize error` does, so they are resized"
    return f"runtime.on_oversize={policy or 'resize'}: {how}"


def _runtime_packing(art: Artifact, plan: Any) -> tuple[bool, str]:
    for runtime, where in ((getattr(plan, "runtime", None), "the preset"), ((art.manifest or {}).get("runtime"), "")):
        if isinstance(runtime, dict) and isinstance(runtime.get("vit_packing"), bool):
            return runtime["vit_packing"], where or MANIFEST_NAME
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
    "--additional-config": "qvl serve --device / --visual-device (qvl passes the placement in it for vllm-rbln 0.11)",
    "--model": "qvl serve DIR",
}


@dataclass
class ServeCheck:
    """What serve checks once before any replica: the artifact that passed the preflight (its files read once), the
    preset's plan, the vllm-rbln the line is for, and the warnings so far. A fleet of N replicas builds each one's
    launch from one ``ServeCheck`` (``replica_command``), never running the preflight N times."""

    art: Artifact
    plan: Any
    engine: Engine
    warnings: list[str]


def serve_command(opts: ServeOptions, environ: Mapping[str, str]) -> tuple[Launch, list[str]]:
    """Preflight, then ``vllm serve DIR ...`` and its environment; InputError before anything starts."""
    return replica_command(check_serve(opts), opts, environ)


def replica_command(check: ServeCheck, opts: ServeOptions, environ: Mapping[str, str]) -> tuple[Launch, list[str]]:
    """``serve_command`` for one replica of an artifact checked already: ``opts`` may differ from the checked one's
    in port, devices and pass-through flags (each is checked here); the artifact is not read again."""
    _, launch, warnings = replica_launch(check, opts, environ)
    key, key_source = api_key(opts.api_key_file, environ)
    _auth(launch, opts, key, key_source, warnings)
    return launch, warnings


def check_serve(opts: ServeOptions, *, command: str = "serve") -> ServeCheck:
    """The checks that hold for every replica, in the order a refusal should come: the vllm-rbln version, the
    emulated host, the directory, the preflight (which reads the artifact, once), the preset."""
    engine = resolve(opts.vllm_rbln, look_here=opts.engine_here)
    if opts.emulate:
        emulated.check_host(opts.host, opts.port)
    directory, warnings = resolve_directory(opts.directory, opts.preset, command)
    art = preflight(directory, emulated=opts.emulate, command=command)
    return ServeCheck(art=art, plan=_preset_plan(opts.preset), engine=engine, warnings=warnings)


def checked_launch(
    opts: ServeOptions,
    environ: Mapping[str, str],
    *,
    command: str = "serve",
    remap: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> tuple[Artifact, Launch, list[str]]:
    """What ``qvl serve --dry-run`` shows, short of who may call: the preflight, the pass-through checks, the
    placement and its memory gate, then ``vllm_launch`` for the vllm-rbln ``opts`` names (``engine.resolve``); under
    ``--emulate`` the artifact must be an emulated one and the host loopback (the command adds the emulator's
    environment: ``emulated.apply``). ``qvl deploy`` calls it too (``remap`` renumbers the placement as a
    pod sees its claimed NPUs), so a cluster runs exactly the command serve would for that vllm-rbln."""
    return replica_launch(check_serve(opts, command=command), opts, environ, remap=remap)


def replica_launch(
    check: ServeCheck,
    opts: ServeOptions,
    environ: Mapping[str, str],
    *,
    remap: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> tuple[Artifact, Launch, list[str]]:
    """``checked_launch`` after ``check_serve``: the pass-through checks, the placement and its memory gate, then
    ``vllm_launch``. Each call gets its own copy of the checks and warnings, so replicas never share lines."""
    art = dataclasses.replace(check.art, checks=list(check.art.checks))
    plan, engine, warnings = check.plan, check.engine, list(check.warnings)
    replaced = check_pass_through(opts.extra, art, SERVE_OWNED)
    where = placement(art, opts.device, opts.visual_device, getattr(plan, "placement", None), opts.force)
    remap_memory_gate(art, opts, plan)
    if remap is not None:
        where = remap(where)
    launch = vllm_launch(
        art,
        plan,
        where,
        host=opts.host,
        port=opts.port,
        served_model_name=opts.served_model_name,
        vit_packing=opts.vit_packing,
        extra=opts.extra,
        replaced=replaced,
        environ=environ,
        warnings=warnings,
        engine=engine,
    )
    return art, launch, warnings


def vllm_launch(
    art: Artifact,
    plan: Any,
    where: dict[str, Any],
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    served_model_name: str | None = None,
    vit_packing: bool | None = None,
    extra: Sequence[str] = (),
    replaced: set[str] | frozenset[str] = frozenset(),
    environ: Mapping[str, str] | None = None,
    warnings: list[str] | None = None,
    engine: Engine | None = None,
) -> Launch:
    """The one builder of the ``vllm serve`` argv and environment for an artifact (or a plan's, ``plan_artifact``):
    ``qvl serve`` runs it, ``qvl tune`` prints it, so the two never differ. ``engine``: the vllm-rbln the line is
    for (default: ``engine.resolve``, the installed one, else the default)."""
    environ = environ if environ is not None else {}
    warnings = warnings if warnings is not None else []
    engine = engine or resolve(None)
    checks = list(art.checks)
    ok(checks, "engine", engine.describe())
    env = _placement_env(where, environ, checks, engine)
    if not usage_stats_opted_in(environ):  # nothing leaves the host unless the user explicitly allows it
        env[USAGE_STATS_ENV] = "1"
    cfg = art.cfg
    argv = ["vllm", "serve", str(art.root), "--host", host, "--port", str(port)]
    name = served_model_name or served_name(art)
    argv += ["--served-model-name", name]
    ok(checks, "served name", f'clients send "model": "{name}" ({_name_source(art, served_model_name)})')
    argv += ["--max-model-len", str(cfg["max_seq_len"]), "--max-num-seqs", str(cfg["batch_size"])]
    ok(checks, "max_model_len", f"{cfg['max_seq_len']} (the compiled max_seq_len; the KV block pool holds it)")
    _image_cap(art, argv, replaced, checks)
    ok(checks, "oversize", _oversize_policy(art, plan))
    if "--limit-mm-per-prompt" not in replaced:
        limits, limits_source, off = limit_mm_per_prompt(art, plan)
        argv += ["--limit-mm-per-prompt", json.dumps(limits)]
        if off:  # a modality turned off by the context is a warning with its cause, never an "ok"
            warn(checks, "limit_mm_per_prompt", f"{json.dumps(limits)} ({limits_source}): " + "; ".join(off))
            warnings.extend(off)
        else:
            ok(checks, "limit_mm_per_prompt", f"{json.dumps(limits)} ({limits_source})")
    argv += [*engine.placement_args(where["overrides"]), "--middleware", KEY_GUARD, *extra]
    ok(
        checks,
        "key guard",
        f"--middleware {KEY_GUARD}: with an API key, {public_rule()} requires it (vLLM alone guards only /v1, /v2 "
        "and /inference, and answers /invocations and /tokenize without it); without a key it lets all through",
    )
    if vit_packing is not None:
        packing, source = vit_packing, "--vit-packing" if vit_packing else "--no-vit-packing"
    else:
        packing, source = _runtime_packing(art, plan)
    env.update(_packing_env(packing, source, environ, checks, warnings))
    if art.processor_fix.get("video"):
        cap = art.processor_fix["cap"]
        env[MAX_FRAME_PIXELS_ENV] = str(cap)
        ok(
            checks,
            "video cap",
            f"{FRAME_CAP_ENV}=1 {MAX_FRAME_PIXELS_ENV}={cap}: the processor files do not cap each frame "
            f"({'; '.join(w for w in art.processor_fix['why'] if 'video' in w or 'frame' in w)}), so the "
            f"{PLUGIN_NAME} plugin caps every video frame at {cap} pixels (the largest ViT bucket {art.buckets[-1]} "
            f"x {art.patch_size}^2) in every vLLM process; the artifact is not edited",
        )
    if needs_sort(cfg):
        env[SORT_ENV] = "1"
        ok(
            checks,
            "decode sort",
            f"{SORT_ENV}=1: the decoder was compiled with _requires_batch_sort (batch_size {cfg['batch_size']}; "
            "optimum-rbln 0.12 refuses a decode batch not sorted by length), and vllm-rbln's optimum runner does not "
            f"sort: the {PLUGIN_NAME} plugin sorts each one in every vLLM process",
        )
    if resume_features.can_preempt(cfg):
        env[resume_features.RESUME_ENV] = "1"
        ok(checks, "preemption", resume_features.check_line(cfg, PLUGIN_NAME))
    return Launch(argv=argv, env=env, checks=checks, engine=engine)


def _image_cap(art: Artifact, argv: list[str], replaced: set[str] | frozenset[str], checks: list) -> None:
    """Images over the largest bucket: capped per request through --mm-processor-kwargs when the processor files
    let them through. transformers 5 ignores ``max_pixels`` alone at call time (it needs ``size``, or both
    min_pixels and max_pixels) and applies a flat ``size`` to videos too, so the cap goes in ``images_kwargs``;
    ``max_pixels`` beside it caps the image processor where vLLM passes the kwargs at load."""
    cap = art.max_pixels
    if not art.processor_fix.get("image"):
        ok(checks, "image cap", f"the processor files cap images at or below {cap} pixels; nothing added")
        return
    if "--mm-processor-kwargs" in replaced:
        ok(checks, "image cap", f"your --mm-processor-kwargs (checked to cap images at or below {cap} pixels)")
        return
    from qwenvl_rbln.vision.geometry import IMAGE_MIN_PIXELS

    low = min(art.processor_fix.get("min_pixels") or IMAGE_MIN_PIXELS, cap)
    argv += ["--mm-processor-kwargs", json.dumps(image_kwargs(low, cap))]
    why = "; ".join(w for w in art.processor_fix["why"] if "image" in w)
    ok(
        checks,
        "image cap",
        f"--mm-processor-kwargs caps each image at {cap} pixels ({art.buckets[-1]} patches, the largest ViT bucket, "
        f"x {art.patch_size}^2) because the processor files do not ({why}); the artifact is not edited",
    )


def plan_artifact(plan: Any, root: str | Path) -> Artifact:
    """The artifact ``qvl compile`` writes for ``plan``, as the numbers serve reads from it (no files): what
    ``qvl tune`` hands to ``vllm_launch`` before anything is compiled. Its processor files carry the plan's caps."""
    r = plan.resolved
    buckets = sorted(r.vit_buckets, reverse=True)
    lm = [{"compiled_model_name": "prefill", "npu": plan.npu, "num_devices": r.num_devices}]
    cfg = {
        "batch_size": r.batch_size,
        "max_seq_len": r.max_seq_len,
        "kvcache_block_size": r.kvcache_block_size,
        "kvcache_num_blocks": r.kvcache_num_blocks or r.num_full_blocks,
        "prefill_chunk_size": r.prefill_chunk_size,
        "_requires_batch_sort": compiled_with_sort(plan.npu, r.attn_impl, r.use_attention_mask),
        "_compile_cfgs": lm,
        "visual": {
            "max_seq_len": buckets,
            "_compile_cfgs": [
                {"compiled_model_name": "compiled_model", "npu": plan.npu, "num_devices": r.visual_num_devices}
            ],
        },
    }
    manifest = {
        "npu": plan.npu,
        "placement": dict(plan.placement),
        "model": {"id": plan.model_id},
        "processor": plan.processor.to_dict(),
        "runtime": dict(plan.runtime or {}),
    }
    vision = plan.geometry.vision
    model_config = {"vision_config": {"patch_size": vision.patch_size, "spatial_merge_size": vision.spatial_merge_size}}
    art = Artifact(root=Path(root), cfg=cfg, manifest=manifest, model_config=model_config)
    art.processor_fix = {"image": False, "video": False, "min_pixels": None, "why": [], "cap": art.max_pixels}
    return art


# ----------------------------------------------------------------------------------- memory of a remap (D5)


def remap_memory_gate(art: Artifact, opts: ServeOptions, plan: Any) -> None:
    """A --device/--visual-device placement other than the compiled one gets load-check's own memory check
    (``jobs.load_check``) and the compile gate: does_not_fit exits 4; uncertain exits 4 unless --uncertain-ok."""
    if opts.device is None and opts.visual_device is None:
        return
    from qwenvl_rbln.artifacts.layout import check_layout
    from qwenvl_rbln.errors import DoesNotFit
    from qwenvl_rbln.jobs.load_check_fixes import devices_text
    from qwenvl_rbln.jobs.load_check_memory import memory_for_placement
    from qwenvl_rbln.memory.placement import check_placement
    from qwenvl_rbln.memory.verdicts import gate_message, gate_stops, verdict_of

    target = art.target
    fallback = {"preset": plan.preset, "placement": plan.placement} if plan is not None else None
    where = check_placement(opts.device, opts.visual_device, art.manifest, target, fallback, art.cfg)
    if where["matches"] and where["compiled"] is not None:
        return  # the placement planned at compile, spelled out: the compile's gate already judged it
    read = art.checked.read if art.checked is not None else None
    layout = check_layout(art.root, "rbln", art.cfg, None, read=read)
    memory = memory_for_placement(art.root, "rbln", art.cfg, layout, target, where["requested"], None, art=art.checked)
    verdict = verdict_of(memory) if memory.get("source") != "unavailable" else None
    given = (("--device", opts.device), ("--visual-device", opts.visual_device))
    shown = " ".join(f"{flag} {devices_text(value)}" for flag, value in given if value is not None)
    if verdict is None:
        warn(art.checks, "memory", f"{shown}: {memory.get('reason')}")
        return
    if gate_stops(verdict, opts.uncertain_ok):
        raise DoesNotFit(
            f"{shown}: " + gate_message(memory, lead="load-check's memory check"),
            f"see `qvl load-check {art.root} --no-runtime {shown}`; keep the compiled placement (drop "
            "--device/--visual-device), or recompile for this one"
            + ("; --uncertain-ok serves an uncertain verdict anyway" if verdict == "uncertain" else ""),
        )
    ok(art.checks, "memory", f"{shown}: load-check's memory check says {verdict} ({memory.get('source')})")


# ------------------------------------------------------------------------------------------ who may call


def _auth(launch: Launch, opts: ServeOptions, key: str | None, source: str, warnings: list[str]) -> None:
    """Off loopback vLLM's API answers anyone who reaches the port: require a key, or an explicit --no-auth that
    says what it exposes. The key goes to vLLM as $VLLM_API_KEY, never in argv, and is never shown."""
    where = host_port(opts.host, opts.port)
    if key is not None:
        launch.env[API_KEY_ENV] = key
        launch.secret = frozenset({*launch.secret, API_KEY_ENV})
        ok(
            launch.checks,
            "auth",
            f"API key from {source} ({REDACTED}), handed to vLLM as ${API_KEY_ENV} in its environment, not in argv: "
            f"on {where}, {public_rule()} requires 'Authorization: Bearer KEY'",
        )
        return
    if is_loopback(opts.host):
        ok(launch.checks, "auth", f"no API key: {where} listens on loopback only (this machine's users can call it)")
        return
    exposed = (
        f"every route of vLLM's API on {where} ({', '.join(GUARDED_EXAMPLES)}, the rest, and the public "
        f"{', '.join(PUBLIC_ROUTES)})"
    )
    if not opts.no_auth:
        raise InputError(
            f"--host {opts.host} serves {exposed} to every machine that can reach this port, and no API key is set",
            f"export {API_KEY_ENV}=KEY or pass --api-key-file FILE (qvl hands the key to vLLM in its environment), or "
            "--no-auth to serve it to anyone, or --host 127.0.0.1",
        )
    line = f"--no-auth: {exposed} answers every machine that can reach this port, without a key"
    warn(launch.checks, "auth", line)
    warnings.append(line)


def _placement_env(
    where: dict[str, Any], environ: Mapping[str, str], checks: list[dict[str, Any]], engine: Engine
) -> dict:
    """The engine's device variable set to exactly the NPUs used; the other generation's name unset."""
    visible = ",".join(map(str, where["visible"]))
    name = engine.device_env
    inherited = environ.get(name)
    note = f" (replaces the inherited {inherited}: qvl's ids are physical NPU ids)"
    ok(
        checks,
        "placement",
        f"LM on NPU {where['device']}, ViT on NPU {where['visual_device']} ({where['source']}); "
        f"{name}={visible}{note if inherited not in (None, visible) else ''}; {engine.placement_flag} carries "
        "positions in that list",
    )
    # the other name must not pick other devices: always unset, so a --dry-run script is the same whatever the
    # printing shell has (it runs on another host, whose environment qvl cannot see)
    return {name: visible, engine.other_device_env: None}


def _packing_env(
    packing: bool, source: str, environ: Mapping[str, str], checks: list[dict[str, Any]], warnings: list[str]
) -> dict[str, str | None]:
    """QVL_VIT_PACKING for the plugin, and the plugin added to a VLLM_PLUGINS allowlist when one is set."""
    env: dict[str, str | None] = {PACKING_ENV: "1" if packing else "0", FRAME_CAP_ENV: "1"}
    ok(
        checks,
        "video frame cap",
        f"{FRAME_CAP_ENV}=1: the {PLUGIN_NAME} plugin caps each video frame at the processor config's "
        "qvl_max_frame_pixels in every vLLM process (qvl must be installed in vllm's Python environment)",
    )
    if environ.get("VLLM_PLUGINS") is not None:  # the plugin also installs the per-frame video cap: always load it
        allowed = [p for p in environ["VLLM_PLUGINS"].split(",") if p.strip()]
        if PLUGIN_NAME not in allowed:  # an allowlist loads nothing else: add the packing plugin to it
            env["VLLM_PLUGINS"] = ",".join([*allowed, PLUGIN_NAME])
    if not packing:
        ok(checks, "vit packing", f"off ({source})")
        return env
    detail = (
        f"on ({source}): the {PLUGIN_GROUP} entry point {PLUGIN_NAME} installs the packed ViT forward in every vLLM "
        "process (qvl must be installed in vllm's Python environment)"
    )
    if not _packing_available():
        detail += "; this qvl has no qwenvl_rbln.backends.vit_packing, so vLLM will run unpacked"
        warnings.append("ViT packing is not available in this qvl build: vLLM will run the ViT unpacked")
    ok(checks, "vit packing", detail)
    return env
