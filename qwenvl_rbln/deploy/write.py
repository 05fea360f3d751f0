"""Write the kustomize folder atomically: every file into a staging sibling, then one rename into place.

``--force`` replaces a folder only when ``qvl deploy`` wrote it: its marker (``.qvl-deploy.json``) lists every file in
it. Anything else there (someone's edits, a different folder named by mistake) is refused and left untouched, as
``artifacts.staging`` refuses to replace a folder that is not an artifact.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from qwenvl_rbln import __version__
from qwenvl_rbln.artifacts.staging import atomic_output_dir, is_protected, non_empty_dir
from qwenvl_rbln.errors import InputError
from qwenvl_rbln.paths import user_path

MARKER = ".qvl-deploy.json"


def _listed(target: Path) -> str | None:
    """None when ``target`` is a folder qvl deploy wrote (its marker lists every file), else why not."""
    try:
        marker = json.loads((target / MARKER).read_text(encoding="utf-8"))
        listed = set(marker["files"]) if marker.get("format") == 1 else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        listed = None
    if listed is None:
        return f"it has no {MARKER} (it was not written by qvl deploy)"
    present = sorted(
        (Path(d) / f).relative_to(target).as_posix() for d, _, files in os.walk(target) for f in files if f != MARKER
    )
    foreign = [p for p in present if p not in listed]
    if foreign:
        return f"it holds files qvl deploy did not write ({', '.join(foreign[:3])})"
    return None


def working_dir() -> Path:
    """The working directory, or one line saying it is gone (deleted, or replaced by a rename, while this shell was
    in it): every relative path would fail with a bare FileNotFoundError otherwise."""
    try:
        return Path.cwd()
    except FileNotFoundError:
        raise InputError(
            "the working directory no longer exists (it was deleted or replaced while this shell was in it); "
            "nothing was written",
            'cd into an existing folder (`cd "$PWD"` re-enters one of the same name), then rerun',
        ) from None


def check_out(target: Path, force: bool) -> Path:
    """The checks made before anything is built or written. OUT is replaced as a whole (a staged folder renamed
    over it), so it is never the working directory, one of its parents, the home directory or the root, not even
    when empty: the shell would be left in a deleted folder."""
    working_dir()
    target = user_path(target, "-o").absolute()
    if is_protected(target):
        raise InputError(
            f"-o {target} is the working directory (or one of its parents, your home or the root): qvl deploy "
            "replaces OUT as a whole and never replaces that folder; nothing was written",
            "run it from the parent folder with -o NAME (`cd .. && qvl deploy ... -o NAME`), or pass a new -o",
        )
    if target.exists() and not target.is_dir():
        raise InputError(f"-o {target} exists and is not a folder", "pass -o with a new folder")
    if non_empty_dir(target):
        if not force:
            raise InputError(
                f"-o {target} already exists and is not empty; it was left untouched",
                "pass --force to replace a folder qvl deploy wrote, or a new -o",
            )
        why = _listed(target)
        if why:
            raise InputError(f"refusing to replace {target} with --force: {why}; nothing was touched", "pass a new -o")
    return target


def write_folder(target: Path, files: dict[str, str | bytes], force: bool) -> Path:
    """Write ``files`` (relative path -> text, or bytes) as the folder ``target``; the old one goes only once the new
    is in (``artifacts.staging.atomic_output_dir``, with this folder's own --force rule)."""
    target = check_out(target, force)
    with atomic_output_dir(target, force, check=check_out) as staging:
        for rel, content in files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content, encoding="utf-8")
        marker = {"format": 1, "written_by": f"qvl deploy {__version__}", "files": sorted(files)}
        (staging / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    return target
