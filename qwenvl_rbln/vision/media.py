"""Header-only probing of input images and videos.

Planning needs each input's size (and a video's frame count and fps) before any model work,
for many files at once, so nothing here decodes pixel data: PIL is opened lazily and PyAV reads
container metadata only. Every failure is an ``InputError`` that names the file, so the CLI can
report bad inputs one per line and carry on with the rest.
"""

from __future__ import annotations

import math
import mmap
import os
import re
import struct
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from qwenvl_rbln.errors import DependencyMissing, InputError
from qwenvl_rbln.vision.geometry import IMAGE_MAX_PIXELS

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"})
VIDEO_EXTENSIONS = frozenset({".mp4", ".webm", ".mkv", ".mov", ".avi", ".m4v"})

_EXIF_ORIENTATION = 0x0112
_SWAPPING_ORIENTATIONS = frozenset({5, 6, 7, 8})  # transpose / rotate 270 / transverse / rotate 90


@dataclass(frozen=True)
class ImageInfo:
    """An image as the model will see it: width/height are after EXIF transpose."""

    path: Path
    width: int
    height: int
    format: str
    orientation: int  # EXIF orientation 1..8 (1 when absent or invalid)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


@dataclass(frozen=True)
class VideoInfo:
    """Container metadata of a video's first video stream (what transformers' decoders report)."""

    path: Path
    width: int
    height: int
    total_frames: int
    fps: float | None  # average frame rate; None when the container has none
    duration_s: float | None
    codec: str
    frames_estimated: bool = False  # total_frames computed as duration * fps (no frame count stored)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


def _one_line(exc: BaseException) -> str:
    """The reason in words: an OS or FFmpeg error's ``strerror`` (PyAV's ``[Errno 1094995529] ...: 'path'`` says
    "Invalid data found when processing input"; the path is already named), else the message on one line."""
    strerror = getattr(exc, "strerror", None)
    text = strerror if isinstance(strerror, str) and strerror.strip() else str(exc)
    text = " ".join(text.split()) or type(exc).__name__
    return text[:200]


def _check_file(path: Path, kind: str) -> None:
    """Missing paths, directories and unreadable files fail the same way for images and videos."""
    if not path.exists():
        raise InputError(f"{path}: no such file", f"check the {kind} path")
    if path.is_dir():
        raise InputError(
            f"{path} is a directory, not an {kind} file",
            f"pass the {kind} files inside it (directories are expanded only where qvl accepts a list of inputs)",
        )
    if not path.is_file():
        raise InputError(f"{path} is not a regular file", f"pass a regular {kind} file")
    try:
        with path.open("rb"):
            pass
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({_one_line(e)})", "check the file permissions") from e


# --- images -----------------------------------------------------------------------------------------

_PNG_IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"


class _PngDamage(Exception):
    """A chunk header that cannot be right: the message says where."""


def _png_chunks(f, size: int) -> Iterator[tuple[int, int, bytes]]:
    """``(position, data length, type)`` of each PNG chunk up to IEND, by seeking over the data (no inflate).

    Chunk types must be four ASCII letters, so a preallocated file (a header, then zeros) stops at its first
    zero chunk; the caller bounds the walk where it must stay cheap.
    """
    pos = 8
    while True:
        f.seek(pos)
        header = f.read(8)
        if len(header) < 8:
            raise _PngDamage("ends before its IEND chunk")
        length, ctype = struct.unpack(">I4s", header)
        if not ctype.isalpha():
            raise _PngDamage(f"has a damaged chunk header at byte {pos}")
        end = pos + 8 + length + 4
        if end > size:
            raise _PngDamage(f"chunk {ctype.decode('latin-1')!r} runs past the end of the file")
        yield pos, length, ctype
        if ctype == b"IEND":
            return
        pos = end


_EXIF_READ_LIMIT = 1 << 20  # IFD0 (where Orientation lives) comes first; Exif blocks are rarely over 64 KiB


@dataclass
class _PngWalk:
    """What one walk of a PNG's chunk headers found."""

    problem: str | None = None  # cut short or damaged
    late_exif: bytes | None = None  # the last eXIf payload after IDAT


def _png_walk(f, size: int) -> _PngWalk:
    """Walk the chunk headers once: is the file cut short, and is there an eXIf after the image data?

    Pillow's lazy open stops at the first IDAT, but transformers' ``load_image`` runs ``exif_transpose``,
    which loads the image: Pillow then reads the chunks after IDAT, a later eXIf replaces an earlier
    one, and the last one rotates the picture (Pillow stops at the next frame's fcTL in an APNG; so
    does this walk). Every walk is bounded by ``HEADER_READ_BUDGET`` chunks (seek + 8-byte read each): a file
    that ends with the IEND chunk was not cut short, so its walk just stops there; any other file is walked to
    its damage, and one with more chunks than the budget before any is refused (a flood of empty 12-byte
    chunks is 2 million Python-level reads in 24 MiB; no real PNG has 20,000 chunks).
    """
    complete = False
    if size >= 8 + len(_PNG_IEND):
        f.seek(size - len(_PNG_IEND))
        complete = f.read(len(_PNG_IEND)) == _PNG_IEND
    out = _PngWalk()
    seen_idat = animated = False
    try:
        for i, (pos, length, ctype) in enumerate(_png_chunks(f, size)):
            if i >= HEADER_READ_BUDGET and not complete:
                out.problem = f"has over {HEADER_READ_BUDGET:,} chunks and does not end with its IEND chunk"
                break
            if complete and (i >= HEADER_READ_BUDGET or (animated and seen_idat and ctype == b"fcTL")):
                break
            animated = animated or ctype == b"acTL"
            seen_idat = seen_idat or ctype == b"IDAT"
            if ctype == b"eXIf" and seen_idat:
                f.seek(pos + 8)
                out.late_exif = f.read(min(length, _EXIF_READ_LIMIT))
    except _PngDamage as e:
        if not complete:
            out.problem = str(e)
    return out


def _png_problem(f, size: int) -> str | None:
    return _png_walk(f, size).problem


def _orientation(img) -> int:
    """EXIF orientation from header data only (base-class getexif: PNG's override would decode)."""
    from PIL import Image

    try:
        with warnings.catch_warnings():  # "Corrupt EXIF data" would be a second stderr line
            warnings.simplefilter("ignore")
            return int(Image.Image.getexif(img).get(_EXIF_ORIENTATION, 1))
    except Exception:
        return 1


def _exif_orientation(data: bytes | None) -> int | None:
    """Orientation in an eXIf chunk's payload (a TIFF block); None when there is none or it has no tag."""
    from PIL import Image

    if not data:
        return None
    exif = Image.Exif()
    try:
        with warnings.catch_warnings():  # "Corrupt EXIF data" would be a second stderr line
            warnings.simplefilter("ignore")
            exif.load(b"Exif\x00\x00" + data)
            value = exif.get(_EXIF_ORIENTATION)
        return None if value is None else int(value)
    except Exception:
        return None


def _jpeg_problem(f, size: int) -> str | None:
    """Walk JPEG marker segments to the first scan, then look for the end-of-image marker.

    0xFFD9 cannot occur inside entropy-coded data (0xFF is stuffed as 0xFF00), so a missing EOI
    after the scan means the file was cut short; data after EOI (e.g. motion-photo trailers) is fine.
    """
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        pos = 2
        while pos < size:
            if mm[pos] != 0xFF:  # junk between segments: PIL skips it too (find: C speed, not a byte loop)
                pos = mm.find(b"\xff", pos)
                if pos < 0:
                    break
                continue
            marker = mm[pos + 1] if pos + 1 < size else None
            if marker is None:
                break
            if marker == 0xFF:  # fill bytes: skip the whole run at once
                run = _FF_RUN.match(mm, pos)
                pos = run.end() - 1 if run else pos + 1
                continue
            if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # standalone markers
                pos += 2
                continue
            if marker == 0xD9:
                return "ends before its image data"
            if pos + 4 > size:
                break
            seg_end = pos + 2 + struct.unpack(">H", mm[pos + 2 : pos + 4])[0]
            if seg_end > size:
                return f"segment 0xFF{marker:02X} runs past the end of the file"
            if marker == 0xDA:  # start of scan
                if mm.find(b"\xff\xd9", seg_end) < 0:
                    return "has no end-of-image marker"
                return None
            pos = seg_end
        return "ends before its image data"


def _webp_problem(f, size: int) -> str | None:
    f.seek(0)
    header = f.read(12)
    if len(header) == 12 and header[:4] == b"RIFF":
        declared = struct.unpack("<I", header[4:8])[0] + 8
        if declared > size:
            return f"declares {declared} bytes but has {size}"
    return None


_COMPLETENESS_CHECKS = {"PNG": _png_problem, "JPEG": _jpeg_problem, "MPO": _jpeg_problem, "WEBP": _webp_problem}


def _structure(path: Path, fmt: str) -> tuple[str | None, bytes | None]:
    """Cheap structural check for a cut-short file (PIL's lazy open does not notice one), and for a PNG the
    eXIf chunk after its image data, from the same walk.

    Only PNG, JPEG/MPO and WebP are checked; other formats fail later, at decode time.
    """
    check = _COMPLETENESS_CHECKS.get(fmt)
    if check is None:
        return None, None
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        if fmt == "PNG":
            walk = _png_walk(f, size)
            return walk.problem, walk.late_exif
        return check(f, size), None


_FF_RUN = re.compile(rb"\xff+")
# Read calls Pillow may make while it looks for an image's size. Its format plugins skip junk and fill bytes
# one read at a time, so a damaged or hostile file of N junk bytes costs N Python-level reads (24 MiB of
# 0xFF after a JPEG marker: ~15 s). Real headers need well under a thousand (an ICC profile split over 255
# APP2 segments is ~800), so this bounds the time without refusing real files.
HEADER_READ_BUDGET = 20_000


class _HeaderTooLong(Exception):
    pass


class _BudgetedFile:
    """The file as Pillow sees it while opening: every read counts against ``HEADER_READ_BUDGET``."""

    def __init__(self, raw, budget: int = HEADER_READ_BUDGET):
        self._raw = raw
        self._left = budget

    def _spend(self) -> None:
        self._left -= 1
        if self._left < 0:
            raise _HeaderTooLong

    def read(self, n: int = -1) -> bytes:
        self._spend()
        return self._raw.read(n)

    def readline(self, limit: int = -1) -> bytes:
        self._spend()
        return self._raw.readline(limit)

    def __getattr__(self, name: str):
        return getattr(self._raw, name)


def _header_too_long(path: Path) -> InputError:
    return InputError(
        f"{path}: damaged image header (no image size within {HEADER_READ_BUDGET} header reads: "
        "junk or fill bytes where the header should be)",
        "re-export or re-download the image",
    )


def _declared_size(path: Path) -> tuple[int, int] | None:
    """The size a bomb-sized image declares, read by PIL's own format plugins (no bomb check there)."""
    from PIL import Image

    Image.init()
    try:
        with path.open("rb") as raw:
            fp = _BudgetedFile(raw)
            prefix = raw.read(16)
            for fmt_id in Image.ID:
                factory, accept = Image.OPEN[fmt_id]
                if accept is not None and not accept(prefix):
                    continue
                raw.seek(0)
                try:
                    im = factory(fp, str(path))
                except Exception:
                    continue
                return im.size
    except OSError:
        return None
    return None


def _downscale_target(size: tuple[int, int] | None) -> str:
    """A size with the same aspect ratio that the processor would not shrink further: nothing the model sees is lost."""
    if size is None:
        return f"at most {IMAGE_MAX_PIXELS:,} pixels"
    w, h = size
    scale = math.sqrt(IMAGE_MAX_PIXELS / (w * h))
    return f"{max(1, math.floor(w * scale))}x{max(1, math.floor(h * scale))} or smaller"


def _bomb_error(path: Path, exc: BaseException) -> InputError:
    """Refused above Pillow's MAX_IMAGE_PIXELS, also in the 1x-2x range where Pillow only warns.

    Deliberate: ``qvl infer`` would decode the whole image (3 bytes a pixel, 256-512 MiB in that
    range) only for the processor to shrink it to at most ``IMAGE_MAX_PIXELS``; qvl has no flag to
    lift the limit, so the hint asks for the downscale the model would do anyway.
    """
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    size = _declared_size(path)
    if size is not None:
        what = f"{size[0]}x{size[1]} ({size[0] * size[1]} pixels)"
    else:
        m = re.search(r"\((\d+) pixels\)", str(exc))
        what = f"{m.group(1)} pixels" if m else "too many pixels"
    return InputError(
        f"{path}: image is {what}, over Pillow's decompression-bomb limit of {limit} pixels "
        f"(qvl refuses everything above it, including up to 2x where Pillow only warns)",
        f"downscale it to {_downscale_target(size)} (e.g. with ImageMagick or an image editor): the Qwen3-VL "
        f"processor resizes every image to at most {IMAGE_MAX_PIXELS:,} pixels anyway, so the model sees the same",
    )


def probe_image(path: str | Path) -> ImageInfo:
    """Read an image's size, format and EXIF orientation without decoding its pixels.

    Orientations 5-8 swap width and height, as transformers' ``load_image`` (``exif_transpose``)
    does; a PNG whose eXIf chunk sits after the image data is found by walking its chunk headers.
    Pillow's decompression-bomb warning (> MAX_IMAGE_PIXELS) is an error here too (see ``_bomb_error``).
    """
    p = Path(path)
    _check_file(p, "image")
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with p.open("rb") as raw, Image.open(_BudgetedFile(raw)) as img:
                width, height = img.size
                fmt = img.format or "unknown"
                orientation = _orientation(img)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise _bomb_error(p, e) from e
    except _HeaderTooLong as e:
        raise _header_too_long(p) from e
    except UnidentifiedImageError as e:
        raise InputError(
            f"{p}: not a recognised image (Pillow cannot identify it)",
            "pass a JPEG/PNG/WebP/BMP/GIF/TIFF image, or a video with a video extension",
        ) from e
    except Exception as e:
        raise InputError(f"{p}: damaged image header ({_one_line(e)})", "re-export or re-download the image") from e
    problem, late_exif = _structure(p, fmt)
    if problem:
        raise InputError(f"{p}: {fmt} file {problem} (truncated or damaged)", "re-export or re-download the image")
    late = _exif_orientation(late_exif)
    orientation = orientation if late is None else late
    if orientation not in range(1, 9):
        orientation = 1
    if orientation in _SWAPPING_ORIENTATIONS:
        width, height = height, width
    return ImageInfo(path=p, width=width, height=height, format=fmt, orientation=orientation)


# --- videos -----------------------------------------------------------------------------------------


def probe_video(path: str | Path) -> VideoInfo:
    """Read a video's first video stream metadata (size, frame count, fps, duration, codec).

    Frame count and fps come from the container (``stream.frames``, ``average_rate``) like
    transformers' PyAV reader; containers that store no frame count (webm/mkv) get
    ``round(duration * fps)`` and ``frames_estimated=True``. Nothing is decoded.
    """
    p = Path(path)
    _check_file(p, "video")
    try:
        import av
    except ImportError as e:
        raise DependencyMissing(
            "PyAV (module 'av') is not installed; it is needed to read video metadata", "pip install av"
        ) from e
    try:
        # absolute: ffmpeg reads a relative name such as "pipe:0" or "concat:a|b" as a protocol, not a file
        container = av.open(str(p.absolute()), mode="r")
    except Exception as e:  # av.error.FFmpegError and friends; garbage fails fast here
        raise InputError(
            f"{p}: not a readable video ({_one_line(e)})",
            "pass an mp4/webm/mkv/mov/avi video, or re-encode it with ffmpeg",
        ) from e
    try:
        if not container.streams.video:
            raise InputError(f"{p}: has no video stream", "pass a file that contains video")
        stream = container.streams.video[0]
        ctx = stream.codec_context
        width = int(ctx.width or 0)
        height = int(ctx.height or 0)
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        fps = float(rate) if rate else None
        duration: float | None = None
        if stream.duration and stream.time_base:
            duration = float(stream.duration * stream.time_base)
        elif container.duration:
            duration = container.duration / av.time_base
        frames = int(stream.frames or 0)
        estimated = False
        if frames <= 0 and duration and fps:
            frames = round(duration * fps)
            estimated = True
        if duration is None and frames > 0 and fps:
            duration = frames / fps
        codec = ctx.name or "unknown"
    except InputError:
        raise
    except Exception as e:
        raise InputError(f"{p}: unreadable video metadata ({_one_line(e)})", "re-encode the video with ffmpeg") from e
    finally:
        container.close()
    if width <= 0 or height <= 0 or frames <= 0:
        raise InputError(
            f"{p}: video metadata has no usable size/frame count (width={width}, height={height}, "
            f"frames={frames}, fps={fps}, duration={duration})",
            "re-encode the video with ffmpeg (e.g. ffmpeg -i in -c:v libx264 out.mp4)",
        )
    return VideoInfo(
        path=p,
        width=width,
        height=height,
        total_frames=frames,
        fps=fps,
        duration_s=duration,
        codec=codec,
        frames_estimated=estimated,
    )


# --- paths and sizes --------------------------------------------------------------------------------


def classify(path: str | Path) -> str:
    """``"video"`` for a video extension, else ``"image"`` (so unknown files get the image error)."""
    return "video" if Path(path).suffix.lower() in VIDEO_EXTENSIONS else "image"


def _is_hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


@dataclass(frozen=True)
class Expansion:
    """What the input paths expand to, and what directories held that qvl does not read (to report it)."""

    files: list[Path]
    skipped: list[Path]  # visible files in the directories without an image/video extension (.heic, no extension)
    empty_dirs: list[Path]  # directories given that held no image or video file at all
    special: list[tuple[Path, str]] = field(default_factory=list)  # FIFOs, sockets, broken links, loops: and why


def expand_inputs_report(paths: Iterable[str | Path]) -> Expansion:
    """Expand directories into their image/video files (recursive, sorted, hidden entries skipped).

    Files given by name are kept whatever their extension and missing paths are kept as given, so
    the caller reports each bad item by name; files a directory holds with another extension are
    returned as ``skipped`` so the caller can say so instead of planning nothing in silence.
    """
    from qwenvl_rbln.vision.dir_walk import walk

    files: list[Path] = []
    skipped: list[Path] = []
    empty: list[Path] = []
    special: list[tuple[Path, str]] = []
    known = IMAGE_EXTENSIONS | VIDEO_EXTENSIONS
    for raw in paths:
        p = Path(raw)
        if not p.is_dir():
            files.append(p)
            continue
        found, odd = walk(p)  # symlinked folders followed, each real folder once
        special.extend(odd)
        media_files = [f for f in found if f.suffix.lower() in known]
        skipped.extend(f for f in found if f.suffix.lower() not in known)
        files.extend(media_files)
        if not media_files:
            empty.append(p)
    return Expansion(files=files, skipped=skipped, empty_dirs=empty, special=special)


def expand_inputs(paths: Iterable[str | Path]) -> list[Path]:
    """The files of ``expand_inputs_report`` (directories expanded, other paths kept as given)."""
    return expand_inputs_report(paths).files


_SIZE_RE = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+)\s*$")


def parse_size(value: str) -> tuple[int, int]:
    """Parse ``"1920x1080"`` into ``(width, height)`` (width first; ``x``, ``X`` or ``×``)."""
    m = _SIZE_RE.match(value or "")
    if not m or int(m.group(1)) <= 0 or int(m.group(2)) <= 0:
        raise InputError(
            f"size {value!r} is not WIDTHxHEIGHT with positive integers", "write it as WIDTHxHEIGHT, e.g. 1920x1080"
        )
    return int(m.group(1)), int(m.group(2))
