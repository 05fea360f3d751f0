"""Atomic output directories: a compile writes into a staging sibling that is renamed into place when complete.

Its own module because it is the one place that deletes user-visible directories: stale staging siblings of killed
processes, and (with ``--force``) a previous artifact, which it first proves is an artifact and not someone's files.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from qwenvl_rbln.artifacts.manifest import MANIFEST_NAME, RBLN_CONFIG_NAME, read_manifest
from qwenvl_rbln.errors import InputError
from qwenvl_rbln.paths import user_path

_TEMP_RE_TEMPLATE = r"^\.{name}\.qvl-(?:tmp|old)-(\d+)-[0-9a-f]+(?:\..*)?$"


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def rmtree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def clean_stale_temp(target: Path) -> list[str]:
    """Remove temp/old siblings of ``target`` left by killed qvl processes (their pid is gone)."""
    target = Path(target)
    parent = target.parent
    if not parent.is_dir():
        return []
    pattern = re.compile(_TEMP_RE_TEMPLATE.format(name=re.escape(target.name)))
    removed = []
    for entry in parent.iterdir():
        m = pattern.match(entry.name)
        if m and not _pid_alive(int(m.group(1))):
            rmtree(entry)
            removed.append(entry.name)
    return sorted(removed)


def non_empty_dir(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def check_target(target: Path, force: bool) -> None:
    """The checks done before anything is written: a file in the way, or an existing artifact without --force."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise InputError(f"output {target} exists and is not a directory", "pass -o with a directory path")
    if not non_empty_dir(target):
        return
    if not force:
        raise InputError(
            f"output directory {target} already exists and is not empty; it was left untouched",
            "pass --force to replace it (the old one is removed only after the new one is complete), or use -o",
        )
    refuse_to_replace_a_non_artifact(target)


def refuse_to_replace_a_non_artifact(target: Path) -> None:
    """``--force`` replaces a compiled artifact, never an arbitrary directory: a typo such as ``-o .`` or
    ``-o ~/thesis`` must not delete a user's files (``replace_refusal`` says why not)."""
    target = Path(target).absolute()
    refusal = replace_refusal(target)
    if refusal is not None:
        why, fix = refusal
        raise InputError(f"refusing to replace {target} with --force: {why}; nothing was touched", fix)


def is_protected(target: Path) -> bool:
    """``target`` is the working directory, one of its parents, the home directory or the root: folders no output
    ever replaces, not even an empty one (renaming a new folder over the working directory leaves the shell in a
    deleted one). Raises FileNotFoundError when the working directory itself was deleted."""
    target = Path(target).absolute()
    cwd = Path.cwd().absolute()
    protected = {Path(target.anchor), Path.home().absolute(), cwd, *cwd.parents}
    return target in protected or target.resolve() in {p.resolve() for p in protected}


def replace_refusal(target: Path) -> tuple[str, str] | None:
    """Why ``--force`` may not replace ``target``, and the fix (None: it may). An artifact is a directory whose qvl
    manifest lists every file in it, or (compiled without qvl) an optimum-rbln ``rbln_config.json`` beside nothing
    but the kinds of file optimum-rbln writes."""
    target = Path(target).absolute()
    if is_protected(target):
        return (
            "it is the working directory, one of its parents, your home or the root",
            "compile into a new directory with -o DIR",
        )
    if target.is_symlink():
        return (
            f"it is a symlink (to {os.readlink(target)})",
            "pass the directory it points to with -o, or a new directory",
        )
    why = _not_an_artifact(target)
    if why:
        return (
            why,
            "compile into a new directory with -o DIR, or move those files out (or remove the directory yourself)",
        )
    return None


# What optimum-rbln's save_pretrained writes (graphs, configs, tokenizer/processor files, host-side weights).
_OPTIMUM_FILE_PATTERNS = ("*.rbln", "*.json", "*.jinja", "*.pth", "merges.txt", "tokenizer.model")


def _all_files(root: Path) -> list[str]:
    """Every regular file below ``root``, hidden ones included (they are someone's files too)."""
    out = []
    for dirpath, _dirs, files in os.walk(root):
        out += [(Path(dirpath) / name).relative_to(root).as_posix() for name in files]
    return sorted(out)


def _not_an_artifact(target: Path) -> str | None:
    """None for a directory --force may replace, else why not (naming a few of the files that block it)."""
    present = [p for p in _all_files(target) if p != MANIFEST_NAME]
    try:
        manifest = read_manifest(target)
    except InputError:
        manifest = None
    if manifest is not None:
        foreign = [p for p in present if p not in manifest["files"]]
        if foreign:
            return f"it holds files its {MANIFEST_NAME} does not list ({_some(foreign)})"
        return None
    try:
        cfg = json.loads((target / RBLN_CONFIG_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cfg = None
    if not isinstance(cfg, dict) or "cls_name" not in cfg:
        where = f"no qvl manifest or optimum-rbln {RBLN_CONFIG_NAME}"
        return f"it is not a compiled artifact ({where}; it holds {_some(present)})"
    foreign = [p for p in present if not any(fnmatch.fnmatch(Path(p).name, pat) for pat in _OPTIMUM_FILE_PATTERNS)]
    if foreign:
        return f"besides the optimum-rbln artifact it holds other files ({_some(foreign)})"
    return None


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f", ... ({len(names)} in all)" if len(names) > 3 else "") if names else "nothing"


@contextlib.contextmanager
def atomic_output_dir(
    target: Path, force: bool = False, check: Callable[[Path, bool], object] | None = None
) -> Iterator[Path]:
    """Yield a temporary sibling of ``target``; on success rename it into place, on any failure delete it.

    ``check(target, force)`` refuses a target that may not be written or replaced, before and again after the
    work (default ``check_target``: the artifact rules; ``qvl deploy`` passes its own folder rules).

    ``target`` is never half-written: the staging directory ``.{name}.qvl-tmp-<pid>-<rand>`` lives beside
    it (same filesystem, so the final rename is atomic). With ``force`` an existing target is first
    renamed to ``.{name}.qvl-old-...`` and deleted only after the new one is in place; if the swap fails
    the old one is put back. Stale staging directories of killed processes are removed on entry.
    """
    target = user_path(target).absolute()
    check = check or check_target
    check(target, force)
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temp(target)
    tag = f"{os.getpid()}-{secrets.token_hex(4)}"
    staging = target.parent / f".{target.name}.qvl-tmp-{tag}"
    staging.mkdir()
    try:
        yield staging
        check(target, force)  # something may have appeared meanwhile
        old = target.parent / f".{target.name}.qvl-old-{tag}"
        moved_old = False
        if target.is_dir():
            if non_empty_dir(target):
                os.rename(target, old)
                moved_old = True
            else:
                target.rmdir()
        try:
            os.rename(staging, target)
        except BaseException:
            if moved_old and not target.exists():
                os.rename(old, target)
            raise
        if moved_old:
            rmtree(old)
    finally:
        if staging.exists():
            rmtree(staging)
        # siblings that helpers derived from the staging name (e.g. optimum-rbln's "<dir>.tmp")
        for entry in target.parent.glob(f"{staging.name}.*"):
            rmtree(entry)
