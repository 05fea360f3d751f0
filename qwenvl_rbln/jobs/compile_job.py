"""`qvl compile` for real: planner verdict, dependency check, lock, cache, backend compile, manifest, rename.

Order matters and is part of the contract:

1. the memory planner's verdict (refuse unless --force) and the backend's dependencies are checked
   before anything is created on disk;
2. an existing non-empty output directory needs --force and is never touched before the new artifact is
   complete;
3. a lock beside the output directory stops a second compile into it (BusyError, exit 6);
4. the backend writes into a temporary sibling, the manifest is written there, then one rename puts it in
   place; Ctrl-C, SIGTERM or any failure deletes the sibling and leaves the old artifact as it was;
5. the compile cache (key: model files' hash, rbln_config without runtime keys, versions, NPU) is looked up
   under the lock and stored after the rename.

Progress lines (stage, elapsed time) and warnings go to the ``info`` / ``warn`` callables the caller passes (the
CLI passes render's); a library caller that passes none gets plain lines on stderr. ``watch(progress)``, when given,
is a context manager around the work (the CLI's live display on a terminal); it has ended before any error leaves
``run_compile``, so a display never covers the final error line.
"""

from __future__ import annotations

import contextlib
import errno
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qwenvl_rbln.artifacts.cache import cache_key, cache_lookup, cache_store, copy_tree, default_cache_dir
from qwenvl_rbln.artifacts.cache_admin import enforce_max_size, entry_in_use
from qwenvl_rbln.artifacts.last_compile import record_last_compile
from qwenvl_rbln.artifacts.locks import lock_path, output_lock, remove_stale_locks
from qwenvl_rbln.artifacts.manifest import (
    MANIFEST_NAME,
    collect_versions,
    compiled_values,
    manifest_for_plan,
    model_fingerprint,
    read_manifest,
    write_manifest,
)
from qwenvl_rbln.artifacts.processor_files import rehash, write_caps
from qwenvl_rbln.artifacts.staging import atomic_output_dir, check_target
from qwenvl_rbln.backends import Progress, backend_module, fmt_elapsed, resolve_source
from qwenvl_rbln.errors import EXIT_INTERRUPTED, BackendError, DoesNotFit, InputError, QvlError, sigterm_as_interrupt
from qwenvl_rbln.paths import user_path


class CompileInterrupted(QvlError):
    """Ctrl-C or SIGTERM during a compile, after the cleanup ran (exit 130).

    Raised as a QvlError rather than re-raising KeyboardInterrupt: Typer turns a KeyboardInterrupt into a
    return value of 130 in non-standalone mode, which would lose the exit code and the message.
    """

    exit_code = EXIT_INTERRUPTED


def _memory_dict(memory: Any) -> dict[str, Any]:
    if memory is None:
        return {}
    if isinstance(memory, dict):
        return memory
    with contextlib.suppress(Exception):
        return memory.to_dict()
    return {}


def _fits(memory: Any) -> bool | None:
    if memory is None:
        return None
    value = memory.get("fits") if isinstance(memory, dict) else getattr(memory, "fits", None)
    return value if isinstance(value, bool) else None


EMULATION_NOTE = (
    "optimum-rbln's real compile ran against qvl's CPU emulator of rebel: graphs are traced torch graphs, not NPU "
    "graphs; this proves glue and host logic, never NPU numerics, memory or compile errors"
)


def _emulated() -> bool:
    from qwenvl_rbln.backends import emulator

    return emulator.is_active()


def _stderr_line(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _stderr_warning(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def refuse_if_not_fit(plan: Any, memory: Any, force: bool, warn: Callable[[str], None] = _stderr_warning) -> None:
    """DoesNotFit (exit 4) when the planner says no and --force was not given (memory.verdicts.ensure_fits: the hint
    carries the planner's --set fixes); with --force a warning says we compile anyway."""
    if _fits(memory) is not False:
        return
    from qwenvl_rbln.memory.verdicts import ensure_fits

    if force:
        from qwenvl_rbln.backends.rbln.device_memory import over_devices_text

        where = over_devices_text(_memory_dict(memory))
        warn(
            f"the memory planner says preset {plan.preset} does not fit on {plan.npu}"
            + (f" ({where})" if where else "")
            + "; compiling anyway (--force)"
        )
        return
    ensure_fits(_memory_dict(memory), force=False)
    raise DoesNotFit(  # ensure_fits always raises for fits=False; this is a guard for a changed planner
        f"the memory planner says preset {plan.preset} does not fit on {plan.npu}; nothing was compiled",
        "see `qvl compile --dry-run` for the breakdown, or pass --force to compile anyway",
    )


def run_compile(
    plan: Any,
    memory: Any,
    *,
    force: bool = False,
    cache_dir: Path | str | None = None,
    use_cache: bool = True,
    as_json: bool = False,
    model_cls: Any = None,
    heartbeat_s: float = 30.0,
    info: Callable[[str], None] = _stderr_line,
    warn: Callable[[str], None] = _stderr_warning,
    watch: Callable[[Progress], contextlib.AbstractContextManager[Any]] | None = None,
) -> dict[str, Any]:
    """Compile ``plan`` into ``plan.output_dir``; see the module docstring for the order of checks.

    ``model_cls`` replaces optimum-rbln's auto class (tests); ``as_json`` does not change the progress lines,
    which always go to stderr.
    """
    del as_json  # progress goes to stderr in both modes; the caller renders the result
    t0 = time.monotonic()
    target = user_path(plan.output_dir, "output_dir").absolute()

    refuse_if_not_fit(plan, memory, force, warn)
    backend = backend_module(plan.backend)
    backend.check_dependencies()
    check_target(target, force)

    progress = Progress(info, heartbeat_s=heartbeat_s, prefix="qvl compile ")
    try:
        with watch(progress) if watch is not None else contextlib.nullcontext():
            return _run(plan, target, backend, progress, force, cache_dir, use_cache, model_cls, t0, warn)
    except KeyboardInterrupt:
        state = "the existing artifact is untouched" if target.exists() else "no output directory was created"
        raise CompileInterrupted(
            f"compile interrupted; nothing half-written was left behind ({state}: {target})",
            "run the same command again to compile",
        ) from None
    except OSError as exc:  # the disk, not qvl: a full disk, a read-only or unwritable output path
        raise write_error(exc, target) from None


# errno values that mean "this output path cannot be written" (a bad -o) rather than "writing failed half-way"
_UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST, errno.EISDIR, errno.ENAMETOOLONG}


# errno values that only a write raises: never blamed on reading the model, whatever path the error names
_WRITE_FAILED = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO}


def _is_output_path(path: Path, target: Path) -> bool:
    """The output directory, a directory above it (created with parents), or one of its .NAME.qvl-* siblings."""
    path = path.absolute()
    if target.is_relative_to(path):
        return True
    try:
        rel = path.relative_to(target.parent)
    except ValueError:
        return False
    first = rel.parts[0] if rel.parts else ""
    return first == target.name or first.startswith(f".{target.name}.qvl-")


def write_error(exc: OSError, target: Path) -> QvlError:
    """One line for an OSError raised while writing an artifact: what failed, on which path, and that the
    existing artifact (if any) was left as it was. Unwritable paths are bad input (exit 2); a full disk or an
    I/O error is a failed write (exit 5)."""
    what = exc.strerror or type(exc).__name__
    # shutil's copy names the source in filename and the destination in filename2 (also for a full disk)
    written = exc.filename2 if exc.filename2 and _is_output_path(Path(str(exc.filename2)), target) else None
    where = written or exc.filename or target
    state = "the existing artifact is untouched" if target.is_dir() else "no output directory was created"
    reading = (
        exc.filename
        and written is None
        and exc.errno not in _WRITE_FAILED
        and not _is_output_path(Path(str(exc.filename)), target)
    )
    if reading:  # reading the model, not writing
        return InputError(
            f"cannot read {exc.filename}: {what}; nothing was written ({state}: {target})",
            "check that the model directory and its files are readable",
        )
    if exc.errno in _UNWRITABLE:
        blocker = next((p for p in [target, *target.parents] if p.exists()), None)
        if blocker is not None and not blocker.is_dir():
            what, where = "a parent of the output path is a file, not a directory", blocker
        return InputError(
            f"cannot write the output directory {target}: {what} ({where}); nothing half-written was left ({state})",
            "compile into a directory you can write with -o DIR",
        )
    return BackendError(
        f"writing the artifact failed: {what} ({where}); nothing half-written was left ({state}: {target})",
        "free space on that filesystem (or fix the device) and rerun, or compile elsewhere with -o DIR",
    )


def _run(
    plan: Any,
    target: Path,
    backend: Any,
    progress: Progress,
    force: bool,
    cache_dir: Path | str | None,
    use_cache: bool,
    model_cls: Any,
    t0: float,
    warn: Callable[[str], None],
) -> dict[str, Any]:
    with sigterm_as_interrupt(), progress:
        progress.stage("resolving model", plan.model_id)
        source, local = resolve_source(plan.model_id, backend=plan.backend)
        progress.stage("hashing model files", str(local) if local else f"{plan.model_id} (hub id, not hashed)")
        model_fp = model_fingerprint(plan.model_id, local)
        versions = collect_versions()
        emulated = plan.backend == "rbln" and _emulated()
        if emulated:  # part of the cache key and the manifest: never mistaken for a real NPU compile
            versions["rebel-compiler"] = f"emulated by qvl ({sys.modules['rebel'].__version__})"
        cache_root = user_path(cache_dir, "cache dir").absolute() if cache_dir else default_cache_dir()
        key: str | None = None
        cache_note: str | None
        if use_cache:
            key, cache_note = cache_key(plan, model_fp, versions)
        else:
            cache_note = "--no-cache"
        status = "off" if key is None else "miss"
        if key is None:
            progress.say(f"compile cache off: {cache_note}")
        entry: Path | None = None

        progress.stage("locking", lock_path(target).name)
        with output_lock(target):
            check_target(target, force)
            with atomic_output_dir(target, force) as staging:
                files = None
                cached: dict[str, Any] = {}
                # a prune leaves the entry alone while it is looked up and linked or copied
                with entry_in_use(cache_root, key) if key is not None else contextlib.nullcontext():
                    if key is not None:
                        progress.stage("cache lookup", f"key {key} in {cache_root}")
                        entry, cache_note = cache_lookup(cache_root, key)
                        status = "hit" if entry is not None else "miss"
                    if entry is not None:
                        progress.stage("cache hit", f"reusing {entry} instead of recompiling")
                        copy_tree(entry, staging)
                if entry is not None:
                    cached = read_manifest(staging) or {}
                    files = cached.get("files")
                    info = cached.get("compile") or {}
                else:
                    info = backend.compile_model(plan, staging, progress, model_cls=model_cls, source=source)
                written = write_caps(staging, plan.processor.to_dict())  # AutoProcessor of DIR gets what fits
                files = rehash(staging, files, written)
                progress.stage("writing manifest", MANIFEST_NAME)
                extra: dict[str, Any] = {
                    "processor_files": written,
                    "compiled": compiled_values(staging),
                    "output_dir": str(target),
                    "compile": info,
                    "cache": {
                        "status": status,
                        "key": key,
                        "dir": str(cache_root) if key else None,
                        "note": cache_note,
                        "source_created_at": cached.get("created_at") if cached else None,
                        "source_timings": cached.get("timings") if cached else None,
                    },
                    "stages": list(progress.stages),
                }
                if emulated:
                    extra["emulated"] = True
                    extra["emulation"] = EMULATION_NOTE
                manifest = manifest_for_plan(
                    plan, model=model_fp, versions=versions, cache_key=key, timings=progress.timings(), extra=extra
                )
                manifest = write_manifest(staging, manifest, files=files)
                progress.stage("renaming into place", str(target))
            stored = None
            if status == "miss" and key is not None:
                progress.stage("storing in cache", str(cache_root / key))
                try:
                    stored = cache_store(cache_root, key, target)
                    for line in enforce_max_size(cache_root, keep={key}):
                        progress.say(line)
                except OSError as exc:
                    warn(f"could not store the artifact in the compile cache {cache_root}: {exc}")
        progress.stage("done")
    record_last_compile(target, plan.preset)
    with contextlib.suppress(OSError):  # the lock files of finished compiles (this one's too) do not pile up
        remove_stale_locks()
    timings = progress.timings()
    elapsed = fmt_elapsed(time.monotonic() - t0)
    if status == "hit":
        summary = f"reused the cached compile {key} for preset {plan.preset} -> {target} in {elapsed} (cache hit)"
    else:
        what = "compiled" if plan.backend == "rbln" else "prepared (torch backend: copied, nothing to compile)"
        if emulated:
            what = "compiled on the CPU emulator (emulated: no NPU compile ran)"
        cache_txt = (
            f"cache miss, stored as {key}"
            if stored
            else (f"cache off: {cache_note}" if status == "off" else "cache miss")
        )
        summary = f"{what} preset {plan.preset} -> {target} in {elapsed} ({cache_txt})"
    return {
        "output_dir": str(target),
        "backend": plan.backend,
        "cache": status,
        "cache_key": key,
        "cache_dir": str(cache_root) if key else None,
        "cache_note": cache_note,
        "timings": timings,
        "stages": progress.stages,
        "manifest": manifest,
        "summary": summary,
    }
