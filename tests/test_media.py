"""media.py: header-only probing, with every bad input turned into a one-line InputError naming the file."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import pytest

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.vision import geometry as g
from qwenvl_rbln.vision import media

Image = pytest.importorskip("PIL.Image")


def _png_header_only(width: int, height: int) -> bytes:
    """A structurally complete PNG that declares any size (its pixel data is never read)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


def _input_error(fn, path: Path) -> InputError:
    with pytest.raises(InputError) as e:
        fn(path)
    assert str(path) in e.value.message
    assert e.value.hint
    assert "\n" not in e.value.one_line()
    return e.value


# --- images -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF"])
def test_probe_image_formats(tmp_path: Path, fmt: str) -> None:
    p = tmp_path / f"a.{fmt.lower()}"
    Image.new("RGB", (300, 200), (10, 20, 30)).save(p, format=fmt)
    info = media.probe_image(p)
    assert (info.width, info.height, info.format, info.orientation) == (300, 200, fmt, 1)
    assert info.to_dict()["path"] == str(p)


@pytest.mark.parametrize(
    ("orientation", "size"),
    [(1, (300, 200)), (3, (300, 200)), (6, (200, 300)), (8, (200, 300)), (5, (200, 300)), (42, (300, 200))],
)
def test_exif_orientation(tmp_path: Path, orientation: int, size: tuple[int, int]) -> None:
    from PIL import ImageOps

    exif = Image.Exif()
    exif[0x0112] = orientation
    p = tmp_path / "rot.jpg"
    Image.new("RGB", (300, 200)).save(p, exif=exif)
    info = media.probe_image(p)
    assert (info.width, info.height) == size
    assert info.orientation == (orientation if orientation <= 8 else 1)
    with Image.open(p) as im:  # what transformers.image_utils.load_image does
        assert ImageOps.exif_transpose(im).size == size


def _png_with_exif_after_idat(width: int, height: int, orientation: int, *, early: int | None = None) -> bytes:
    """A PNG whose eXIf chunk comes after IDAT (Pillow's lazy open stops at IDAT; its load() reads on)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    def exif(value: int) -> bytes:
        e = Image.Exif()
        e[0x0112] = value
        return e.tobytes()  # TIFF header + IFD0, what an eXIf chunk holds

    raw = b"".join(b"\x00" + b"\x80" * (width * 3) for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = chunk(b"IHDR", ihdr)
    if early is not None:
        body += chunk(b"eXIf", exif(early))
    body += chunk(b"IDAT", zlib.compress(raw)) + chunk(b"eXIf", exif(orientation)) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


@pytest.mark.parametrize(("orientation", "size"), [(5, (20, 50)), (6, (20, 50)), (8, (20, 50)), (3, (50, 20))])
def test_png_exif_after_the_image_data(tmp_path: Path, orientation: int, size: tuple[int, int]) -> None:
    """Audit: an eXIf chunk after IDAT was missed (orientation 5 read as 1, width/height not swapped)."""
    from PIL import ImageOps

    p = tmp_path / "late.png"
    p.write_bytes(_png_with_exif_after_idat(50, 20, orientation))
    info = media.probe_image(p)
    assert info.orientation == orientation and (info.width, info.height) == size
    with Image.open(p) as im:  # what transformers.image_utils.load_image does
        assert ImageOps.exif_transpose(im).size == size


def test_png_late_exif_replaces_an_early_one_as_in_pillow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """exif_transpose loads the image first, so Pillow's last eXIf chunk (after IDAT) is the one that counts."""
    from PIL import ImageOps

    p = tmp_path / "both.png"
    p.write_bytes(_png_with_exif_after_idat(50, 20, 6, early=1))
    with Image.open(p) as im:
        assert ImageOps.exif_transpose(im).size == (20, 50)

    def boom(self):  # noqa: ANN001
        raise AssertionError("pixel data was decoded")

    monkeypatch.setattr("PIL.ImageFile.ImageFile.load", boom)
    info = media.probe_image(p)  # found by the chunk walk, nothing decoded
    assert info.orientation == 6 and (info.width, info.height) == (20, 50)


def test_probe_image_does_not_decode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "a.png"
    Image.new("RGB", (64, 64)).save(p)

    def boom(self):  # noqa: ANN001
        raise AssertionError("pixel data was decoded")

    monkeypatch.setattr(Image.Image, "load", boom)
    monkeypatch.setattr("PIL.ImageFile.ImageFile.load", boom)
    assert media.probe_image(p).width == 64


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_truncated_image(tmp_path: Path, fmt: str) -> None:
    src = tmp_path / f"full.{fmt.lower()}"
    Image.effect_noise((256, 256), 64).convert("RGB").save(src, format=fmt)
    data = src.read_bytes()
    p = tmp_path / f"cut.{fmt.lower()}"
    p.write_bytes(data[: len(data) // 2])
    err = _input_error(media.probe_image, p)
    assert "truncated" in err.message


def test_a_cut_png_of_tiny_chunks_is_refused_after_the_chunk_budget(tmp_path: Path, monkeypatch) -> None:
    """Without IEND the walk would visit every 12-byte chunk (2 million Python-level reads in 24 MiB): it stops
    at HEADER_READ_BUDGET chunks, counted here by reads, not timed; a short cut file still names its cut."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    monkeypatch.setattr(media, "HEADER_READ_BUDGET", 500)
    head = _png_header_only(64, 64)[: -len(chunk(b"IEND", b""))]
    flood = tmp_path / "flood.png"
    flood.write_bytes(head + chunk(b"IDAT", b"") * 5_000)
    reads = []
    real_open = Path.open

    def counting_open(self, *args, **kwargs):
        f = real_open(self, *args, **kwargs)
        if self == flood and "b" in (args[0] if args else kwargs.get("mode", "r")):
            real_read = f.read
            f.read = lambda *a: reads.append(1) or real_read(*a)  # type: ignore[method-assign]
        return f

    monkeypatch.setattr(Path, "open", counting_open)
    err = _input_error(media.probe_image, flood)
    assert "has over 500 chunks and does not end with its IEND chunk" in err.message
    assert len(reads) < 600, len(reads)
    monkeypatch.setattr(Path, "open", real_open)
    short = tmp_path / "short.png"
    short.write_bytes(head + chunk(b"IDAT", b"") * 100)
    assert "ends before its IEND chunk" in _input_error(media.probe_image, short).message


def test_jpeg_with_trailing_data_is_fine(tmp_path: Path) -> None:
    p = tmp_path / "motion.jpg"
    Image.new("RGB", (64, 32)).save(p)
    p.write_bytes(p.read_bytes() + os.urandom(4096))  # e.g. a motion-photo trailer after EOI
    assert media.probe_image(p).width == 64


@pytest.mark.parametrize(
    ("name", "content"), [("noise.jpg", os.urandom(4096)), ("notes.txt", b"hello\n"), ("empty.png", b"")]
)
def test_not_an_image(tmp_path: Path, name: str, content: bytes) -> None:
    p = tmp_path / name
    p.write_bytes(content)
    _input_error(media.probe_image, p)


def test_missing_and_directory(tmp_path: Path) -> None:
    assert "no such file" in _input_error(media.probe_image, tmp_path / "nope.jpg").message
    assert "directory" in _input_error(media.probe_image, tmp_path).message
    assert "directory" in _input_error(media.probe_video, tmp_path).message
    _input_error(media.probe_video, tmp_path / "nope.mp4")


@pytest.mark.parametrize("side", [100_000, 10_000])  # > 2x limit: PIL error; > 1x limit: PIL warning
def test_decompression_bomb(tmp_path: Path, side: int) -> None:
    p = tmp_path / "bomb.png"
    p.write_bytes(_png_header_only(side, side))
    err = _input_error(media.probe_image, p)
    assert f"{side}x{side}" in err.message
    assert str(Image.MAX_IMAGE_PIXELS) in err.message
    assert "including up to 2x where Pillow only warns" in err.message  # refused deliberately: see media._bomb_error
    hint = err.hint or ""
    assert "MAX_IMAGE_PIXELS" not in hint  # qvl has no flag for it: the hint must be something a user can do
    assert "downscale it to 4096x4096 or smaller" in hint and "16,777,216" in hint


def test_bomb_limit_is_read_at_call_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "big.png"
    p.write_bytes(_png_header_only(10_000, 10_000))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    assert media.probe_image(p).width == 10_000


# --- videos -----------------------------------------------------------------------------------------


def _write_video(path: Path, width: int, height: int, frames: int, fps: int, codec: str = "mpeg4") -> None:
    av = pytest.importorskip("av")
    np = pytest.importorskip("numpy")
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            pixels = np.full((height, width, 3), i * 8 % 256, np.uint8)
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


@pytest.mark.parametrize(("ext", "estimated"), [("mp4", False), ("mov", False), ("avi", False), ("mkv", True)])
def test_probe_video(tmp_path: Path, ext: str, estimated: bool) -> None:
    p = tmp_path / f"v.{ext}"
    _write_video(p, 64, 48, 30, 10)
    info = media.probe_video(p)
    assert (info.width, info.height, info.total_frames, info.fps, info.codec) == (64, 48, 30, 10.0, "mpeg4")
    assert info.duration_s == pytest.approx(3.0)
    assert info.frames_estimated is estimated
    assert info.to_dict()["path"] == str(p)


def test_probe_video_matches_transformers_processor(tmp_path: Path) -> None:
    """Our probe + geometry == transformers' own PyAV reader + Qwen3VLVideoProcessor on a real mp4."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torchvision")
    from transformers.video_utils import load_video

    p = tmp_path / "v.mp4"
    _write_video(p, 64, 48, 30, 10)
    info = media.probe_video(p)
    frames, meta = load_video(str(p), backend="pyav")
    assert (meta.total_num_frames, meta.fps, meta.width, meta.height) == (
        info.total_frames,
        info.fps,
        info.width,
        info.height,
    )
    proc = transformers.Qwen3VLVideoProcessor(
        size={"shortest_edge": g.VIDEO_MIN_PIXELS, "longest_edge": g.VIDEO_MAX_PIXELS},
        fps=2,
        min_frames=4,
        max_frames=768,
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )
    out = proc(
        videos=[frames],
        video_metadata=[{"total_num_frames": meta.total_num_frames, "fps": meta.fps}],
        do_sample_frames=True,
        return_metadata=True,
        return_tensors="pt",
    )
    geo = g.video_geometry(info.width, info.height, info.total_frames, info.fps)
    assert out["video_grid_thw"].tolist() == [[geo.temporal_patches, geo.grid_h, geo.grid_w]]
    assert len(out["video_metadata"][0].frames_indices) == geo.sampled_frames == 6


@pytest.mark.parametrize(
    ("name", "content"), [("noise.mp4", os.urandom(200_000)), ("text.webm", b"hi\n" * 100), ("empty.mkv", b"")]
)
def test_not_a_video(tmp_path: Path, name: str, content: bytes) -> None:
    pytest.importorskip("av")
    p = tmp_path / name
    p.write_bytes(content)
    _input_error(media.probe_video, p)


def test_an_unreadable_video_is_explained_in_words_not_an_errno(tmp_path: Path) -> None:
    """PyAV's invalid-data error is ``[Errno 1094995529] Invalid data found when processing input: 'path'``: the
    line names the file once and gives the reason in words (new-user audit D27)."""
    pytest.importorskip("av")
    p = tmp_path / "noise.mp4"
    p.write_bytes(bytes(range(256)) * 40)
    with pytest.raises(InputError) as e:
        media.probe_video(p)
    assert e.value.message == f"{p}: not a readable video (Invalid data found when processing input)"
    assert "Errno" not in e.value.message


def test_audio_only_is_not_a_video(tmp_path: Path) -> None:
    av = pytest.importorskip("av")
    np = pytest.importorskip("numpy")
    p = tmp_path / "sound.mp4"
    with av.open(str(p), "w") as container:
        stream = container.add_stream("aac", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate = 8000
        for packet in [*stream.encode(frame), *stream.encode()]:
            container.mux(packet)
    assert "no video stream" in _input_error(media.probe_video, p).message


# --- paths and sizes --------------------------------------------------------------------------------


def test_classify() -> None:
    for name in ["a.mp4", "b.WEBM", "c.mkv", "d.mov", "e.avi", "f.M4V"]:
        assert media.classify(name) == "video"
    for name in ["a.jpg", "b.PNG", "c", "d.txt", "e.mp4.png"]:
        assert media.classify(name) == "image"


def test_expand_inputs(tmp_path: Path) -> None:
    d = tmp_path / "dir"
    (d / "sub").mkdir(parents=True)
    (d / ".hidden").mkdir()
    for rel in ["b.jpg", "a.PNG", "sub/c.mp4", "sub/notes.txt", ".hidden/x.jpg", "._junk.jpg"]:
        (d / rel).write_bytes(b"x")
    loose = tmp_path / "loose.txt"
    loose.write_text("x")
    missing = tmp_path / "missing.jpg"
    out = media.expand_inputs([loose, d, missing])
    assert out == [loose, d / "a.PNG", d / "b.jpg", d / "sub" / "c.mp4", missing]


def test_expand_inputs_report_names_what_it_skips(tmp_path: Path) -> None:
    d = tmp_path / "dir"
    (d / "sub").mkdir(parents=True)
    (d / ".git").mkdir()
    for rel in ["a.jpg", "b.heic", "sub/noext", ".git/config", ".DS_Store"]:
        (d / rel).write_bytes(b"x")
    empty = tmp_path / "empty"
    empty.mkdir()
    only_heic = tmp_path / "heic"
    only_heic.mkdir()
    (only_heic / "x.HEIC").write_bytes(b"x")
    report = media.expand_inputs_report([d, empty, only_heic])
    assert report.files == [d / "a.jpg"]
    assert report.skipped == [d / "b.heic", d / "sub" / "noext", only_heic / "x.HEIC"]
    assert report.empty_dirs == [empty, only_heic]


@pytest.mark.parametrize(
    ("text", "size"),
    [("1920x1080", (1920, 1080)), ("640X480", (640, 480)), ("64×48", (64, 48)), (" 10 x 20 ", (10, 20))],
)
def test_parse_size(text: str, size: tuple[int, int]) -> None:
    assert media.parse_size(text) == size


@pytest.mark.parametrize("text", ["1920", "1920x", "x1080", "0x10", "axb", "1920x1080x3", "-5x5", "", "1.5x2"])
def test_parse_size_bad(text: str) -> None:
    with pytest.raises(InputError) as e:
        media.parse_size(text)
    assert repr(text) in e.value.message
    assert "WIDTHxHEIGHT" in (e.value.hint or "")
