"""The files a directory argument holds: symlinked folders followed (each real folder once, so a loop ends),
and every entry that is not a regular file named with why it is skipped.

Its own module because a silent skip reads as "nothing there": a FIFO, a socket, a device, a broken link or a
folder link that loops back must be reported, as the files without a media extension are.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def _kind(path: Path) -> str:
    """Why a non-regular entry is skipped."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "a broken symlink" if os.path.islink(path) else "unreadable"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def walk(root: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(regular files, [(entry, why skipped)]) under ``root``, sorted; hidden entries are left out."""
    files: list[Path] = []
    special: list[tuple[Path, str]] = []
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        st = os.stat(dirpath)
        if (st.st_dev, st.st_ino) in seen:  # a folder link back into the tree: walked already
            dirnames[:] = []
            special.append((Path(dirpath), "a folder already walked by another path (a symlink loop, or a 2nd link)"))
            continue
        seen.add((st.st_dev, st.st_ino))
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            path = Path(dirpath) / name
            if path.is_file():
                files.append(path)
            else:
                special.append((path, _kind(path)))
    return sorted(files), sorted(special)
