"""The qvl that runs ``qvl deploy``, as a wheel written beside the Containerfile: the serving image installs exactly
this qvl from its build context, and no package index is asked for it (qwenvl-rbln is not published on one).

A wheel (PEP 427) is a zip of the package files plus a ``.dist-info`` folder: ``METADATA``, ``WHEEL``,
``entry_points.txt`` (vLLM finds qvl's plugin through the ``vllm.general_plugins`` entry point) and ``RECORD`` (each
file's sha256 and size, which pip checks). The package is taken from where ``qwenvl_rbln`` is imported, with the
presets (``configs/``, inside the package in an installed wheel, beside it in a checkout); no build tool is needed.
The bytes depend on the files alone (fixed dates, sorted names), so writing the folder again gives the same wheel.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import zipfile
from pathlib import Path

from qwenvl_rbln import __version__

DIST = "qwenvl_rbln"
PROJECT = "qwenvl-rbln"
_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip holds: reproducible bytes
_SKIPPED_SUFFIXES = (".pyc", ".pyo")


def wheel_name() -> str:
    return f"{DIST}-{__version__}-py3-none-any.whl"


def _package_files() -> list[tuple[str, Path]]:
    """(name in the wheel, file) for the package and its presets; caches and compiled bytecode left out."""
    import qwenvl_rbln

    pkg = Path(qwenvl_rbln.__file__).resolve().parent
    found = {
        f"{DIST}/{path.relative_to(pkg).as_posix()}": path
        for path in pkg.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in _SKIPPED_SUFFIXES
    }
    presets = pkg.parent / "configs"  # a checkout: the wheel build force-includes configs/ as qwenvl_rbln/configs
    if presets.is_dir() and not (pkg / "configs").is_dir():
        for path in presets.rglob("*"):
            if path.is_file():
                found[f"{DIST}/configs/{path.relative_to(presets).as_posix()}"] = path
    return sorted(found.items())


def _metadata() -> tuple[str, str]:
    """(METADATA, entry_points.txt): the installed distribution's when it is this version, else the minimum."""
    from importlib import metadata

    from qwenvl_rbln.serving.options import PLUGIN_GROUP, PLUGIN_NAME

    try:
        dist = metadata.distribution(PROJECT)
        if dist.version == __version__:
            meta, entry_points = dist.read_text("METADATA"), dist.read_text("entry_points.txt")
            if meta and entry_points:
                return meta, entry_points
    except metadata.PackageNotFoundError:
        pass
    meta = f"Metadata-Version: 2.1\nName: {PROJECT}\nVersion: {__version__}\nRequires-Python: >=3.11\n"
    entry_points = (
        "[console_scripts]\nqvl = qwenvl_rbln.entry:main\n\n"
        f"[{PLUGIN_GROUP}]\n{PLUGIN_NAME} = qwenvl_rbln.vllm_plugin:register\n"
    )
    return meta, entry_points


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


@functools.cache
def build_wheel() -> bytes:
    """This qvl as wheel bytes (``wheel_name()``), installable with ``pip install --no-deps --no-index``; built once
    per process."""
    info = f"{DIST}-{__version__}.dist-info"
    meta, entry_points = _metadata()
    wheel = f"Wheel-Version: 1.0\nGenerator: qvl deploy {__version__}\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entries = [(name, path.read_bytes()) for name, path in _package_files()]
    entries += [(f"{info}/METADATA", meta.encode()), (f"{info}/WHEEL", wheel.encode())]
    entries.append((f"{info}/entry_points.txt", entry_points.encode()))
    record = "\n".join([*(_record_line(n, d) for n, d in entries), f"{info}/RECORD,,"]) + "\n"
    entries.append((f"{info}/RECORD", record.encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            item = zipfile.ZipInfo(name, date_time=_DATE)
            item.external_attr = 0o644 << 16
            item.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(item, data)
    return buf.getvalue()
