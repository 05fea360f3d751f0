"""What every qvl picture shares: the optional matplotlib import, one fixed style, and an atomic save.

Headless and reproducible: figures are built with ``matplotlib.figure.Figure`` and the Agg / SVG canvases (no
pyplot, no global backend switch), under one ``rc_context`` with fixed fonts and ``svg.hashsalt``, and saved
without a date, so two runs on the same input give the same bytes. SVG text stays text (``svg.fonttype:
none``): a reader (or a test) finds the plotted numbers in the file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import DependencyMissing, InputError

INSTALL = 'pip install "qwenvl-rbln[plot]"'
FORMATS = (".png", ".svg")
GiB = 1 << 30

# verdict -> colour (colour-blind safe: blue / orange / vermillion from Okabe-Ito)
VERDICT_COLOUR = {"fits": "#009E73", "uncertain": "#E69F00", "does_not_fit": "#D55E00", None: "#777777"}

STYLE: dict[str, Any] = {
    "font.family": "DejaVu Sans",  # shipped with matplotlib: the same glyphs on every machine
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.25,
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "svg.hashsalt": "qvl",
    "svg.fonttype": "none",
    "path.simplify": False,
}
METADATA = {".svg": {"Date": None, "Creator": "qvl"}, ".png": {"Software": "qvl"}}


def check_plot_path(path: Path | str | None) -> Path | None:
    """The plot path, refused before any work when its suffix or directory is wrong (exit 2), and matplotlib
    missing refused the same way (exit 3): a command never computes for minutes to fail at the picture."""
    if path is None:
        return None
    p = Path(path)
    if p.suffix.lower() not in FORMATS:
        raise InputError(f"--plot {p}: the file must end in .png or .svg", "name the picture e.g. plan.png or plan.svg")
    parent = p.absolute().parent
    if not parent.is_dir():
        raise InputError(f"--plot {p}: the directory {parent} does not exist", "create it first or plot elsewhere")
    require_matplotlib()
    return p


def require_matplotlib() -> Any:
    """matplotlib, or DependencyMissing (exit 3) naming the install command."""
    try:
        import matplotlib
    except ImportError:
        raise DependencyMissing(
            "--plot needs matplotlib, which is not installed", f"{INSTALL} (or `pip install matplotlib`)"
        ) from None
    return matplotlib


@contextlib.contextmanager
def styled() -> Iterator[Any]:
    """A new Figure class under qvl's fixed style (the rc_context spans building and saving)."""
    mpl = require_matplotlib()
    from matplotlib.figure import Figure

    with mpl.rc_context(STYLE):
        yield Figure


def save(fig: Any, path: Path) -> Path:
    """Write ``fig`` beside ``path`` and rename it into place: an interrupted save leaves no half picture."""
    suffix = path.suffix.lower()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.qvl-", suffix=suffix, dir=path.absolute().parent)
    except OSError as exc:
        raise InputError(
            f"--plot {path}: cannot write there ({exc.strerror or exc})", "plot into a writable directory"
        ) from None
    os.close(fd)
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)  # as an ordinary new file, not mkstemp's 0600
    try:
        fig.savefig(tmp, format=suffix[1:], metadata=METADATA[suffix])
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise InputError(
                f"--plot {path}: cannot write the picture ({exc.strerror or exc})", "plot into a writable directory"
            ) from None
        raise
    return path


def draw(path: Path, build: Callable[[Any], Any]) -> Path:
    """Build a figure with ``build(Figure)`` under the fixed style and save it atomically."""
    with styled() as figure_cls:
        fig = build(figure_cls)
        return save(fig, path)
