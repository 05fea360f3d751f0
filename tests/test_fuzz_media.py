"""Fuzzing the header-only media probes: whatever the bytes, a result or an InputError, fast, in bounded memory.

Every probe runs in the worker of ``benchmarks/fuzz_media.py`` (RLIMIT_AS 512 MiB, a 2 s CPU-time alarm, and a watchdog
that kills a worker stuck in C code), so a hang or a memory blow-up is a test failure, not a stuck test run.
The harness itself is checked first: a probe that sleeps, hangs, allocates or raises must be reported as such.
"""

from __future__ import annotations

import importlib.util
import os
import struct
import sys
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers_cli import REPO, run_qvl

pytest.importorskip("PIL")
pytest.importorskip("av")

_spec = importlib.util.spec_from_file_location("fuzz_media", REPO / "benchmarks" / "fuzz_media.py")
fm = importlib.util.module_from_spec(_spec)
sys.modules["fuzz_media"] = fm
_spec.loader.exec_module(fm)

TIMEOUT_S = 2.0  # CPU seconds per probe (the worker's alarm): load on the machine does not count
MEMORY_MB = 512
WATCHDOG_S = 120.0  # wall seconds before a probe counts as hung: a bound on a loaded machine, not a budget
SEEDS = fm.seed_files()
CRAFTED = fm.crafted_files(SEEDS)
# Formats whose cut-short files qvl detects itself (media._completeness_problem); the others fail at decode time.
CHECKED_COMPLETE = ("seed.png", "seed.jpg", "seed_progressive.jpg", "seed.webp", "seed_lossless.webp")


@pytest.fixture(scope="module")
def prober():
    with fm.Prober(MEMORY_MB, TIMEOUT_S, watchdog_s=WATCHDOG_S) as p:
        yield p


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def _probe(prober, path: Path, label: str, kind: str | None = None) -> dict:
    result = prober.probe(path, kind)
    assert not fm.is_failure(result, TIMEOUT_S, MEMORY_MB), (label, result)
    return result


def _write(workdir: Path, name: str, data: bytes) -> Path:
    path = workdir / name
    path.write_bytes(data)
    return path


# --- the harness catches what it is there to catch ---------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "status"),
    [
        ("selftest-spin", "timeout"),
        ("selftest-hang", "hang"),
        ("selftest-alloc", "memory"),
        ("selftest-crash", "crash"),
    ],
)
def test_the_harness_reports_hangs_memory_and_crashes(tmp_path, kind, status):
    """A worker's start is not part of any probe (it says READY first), and only the hang has a short watchdog:
    every other probe answers by itself, so its watchdog is a bound for a loaded machine, not a race."""
    png = _write(tmp_path, "a.png", SEEDS["seed.png"])
    with fm.Prober(256, 0.3, selftest=True, watchdog_s=2.0 if status == "hang" else WATCHDOG_S) as p:
        result = p.probe(png, kind)
        assert result["status"] == status, result
        assert fm.is_failure(result, 0.3, 256)
        p.watchdog_s = WATCHDOG_S
        again = p.probe(png)  # and it carries on with a fresh worker when the last one was killed
        assert again["status"] == "ok" and again["detail"] == "96x64", again


def test_enomem_is_a_failure_only_when_memory_was_really_needed(tmp_path):
    """ffmpeg answers ENOMEM for absurd declared sizes without allocating: fine. A real allocation over the
    limit is a failure even when it surfaces as an InputError."""
    png = _write(tmp_path, "a.png", SEEDS["seed.png"])
    with fm.Prober(256, 2.0, selftest=True, watchdog_s=WATCHDOG_S) as p:
        refused = p.probe(png, "selftest-enomem")
        assert refused["status"] == "input_error" and "without allocating" in refused["detail"], refused
        assert not fm.is_failure(refused, 2.0, 256)
        real = p.probe(png, "selftest-enomem-real")
        assert real["status"] == "memory" and fm.is_failure(real, 2.0, 256), real


def test_seed_files_are_valid(prober, workdir):
    """Otherwise the truncation and mutation tests below would fuzz garbage and prove little."""
    assert {Path(n).suffix for n in SEEDS} >= {".png", ".jpg", ".gif", ".webp", ".mp4"}
    for name, data in SEEDS.items():
        result = _probe(prober, _write(workdir, name, data), name)
        assert result["status"] == "ok", (name, result)
        assert result["detail"] in ("96x64", "64x48"), (name, result)


# --- truncation at every k-th byte ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_truncated_at_every_kth_byte(prober, workdir, name):
    data = SEEDS[name]
    points = fm.truncation_points(len(data), max(1, len(data) // 48))
    statuses = []
    for cut in points:
        path = _write(workdir, f"cut{Path(name).suffix}", data[:cut])
        statuses.append(_probe(prober, path, f"{name} cut at {cut}")["status"])
    if name in CHECKED_COMPLETE:  # a cut-short PNG/JPEG/WebP is never reported as fine
        assert set(statuses) == {"input_error"}, (name, list(zip(points, statuses, strict=True)))
    assert statuses[0] == "input_error"  # the empty file


# --- wrong extensions -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_wrong_extension(prober, workdir, name):
    for ext in fm.ALL_EXTS:
        if ext == Path(name).suffix:
            continue
        _probe(prober, _write(workdir, f"wrong{ext}", SEEDS[name]), f"{name} as {ext}")


# --- headers that declare huge sizes --------------------------------------------------------------------

BOMBS = {
    "huge_ihdr.png": "2147483647x2147483647",
    "huge_ihdr_wide.png": "2147483647x1",
    "huge_sof.jpg": "65535x65535",
    "huge_screen.gif": "65535x65535",
    "huge_info.bmp": "2147483647x2147483647",
    "huge_ifd.tiff": "4294967295x4294967295",
    "huge_canvas.webp": "pixels",
}


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_huge_declared_dimensions(prober, workdir, name):
    result = _probe(prober, _write(workdir, name, CRAFTED[name]), name)
    if name in BOMBS:
        assert result["status"] == "input_error", result
        assert "decompression-bomb limit" in result["detail"] and BOMBS[name] in result["detail"], result
        assert name in result["detail"]  # the message names the file


def test_y4m_declaring_huge_frames_in_an_mp4(prober, workdir):
    """ffmpeg sniffs content, not extensions: a YUV4MPEG header inside an .mp4 that declares 2^31-1 x 2^31-1."""
    for dims in ("W65535 H65535", "W2147483647 H2147483647", "W100000 H1", "W0 H0"):
        data = f"YUV4MPEG2 {dims} F10:1 Ip A1:1 C420jpeg\nFRAME\n".encode() + b"\x80" * 64
        _probe(prober, _write(workdir, "y4m.mp4", data), dims)


# --- junk floods: Pillow skips junk one read at a time -----------------------------------------------------

_SIG = b"\x89PNG\r\n\x1a\n"


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


_IHDR = _SIG + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", 64, 64, 8, 2, 0, 0, 0))
_JFIF = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
FLOOD = 24 << 20  # 24 MiB: about 15 s of Pillow's byte-by-byte loops before the fix
FLOODS = {
    "fill_bytes.jpg": lambda: b"\xff\xd8" + b"\xff" * FLOOD,
    "empty_app_segments.jpg": lambda: b"\xff\xd8" + b"\xff\xe1\x00\x02" * (FLOOD // 4),
    "junk_after_jfif.jpg": lambda: _JFIF + b"\x01" * FLOOD,
    "text_chunks.png": lambda: _IHDR + _png_chunk(b"tEXt", b"") * (FLOOD // 12) + _png_chunk(b"IEND", b""),
    "empty_idat_chunks.png": lambda: _IHDR + _png_chunk(b"IDAT", b"") * (FLOOD // 12) + _png_chunk(b"IEND", b""),
    "cut_empty_idat_chunks.png": lambda: _IHDR + _png_chunk(b"IDAT", b"") * (FLOOD // 12),
    "zeros_after_screen.gif": lambda: b"GIF89a" + struct.pack("<HHBBB", 64, 64, 0, 0, 0) + b"\x00" * FLOOD,
}


@pytest.mark.parametrize("name", sorted(FLOODS))
def test_junk_floods_answer_within_the_bound(prober, workdir, name):
    _probe(prober, _write(workdir, name, FLOODS[name]()), name)


_IDAT = _png_chunk(b"IDAT", zlib.compress((b"\x00" + b"\x80" * 192) * 64))  # 64 rows of 64 RGB pixels
LATE_EXIF = {  # the eXIf chunk after IDAT is found by a bounded chunk walk: hostile ones cost no more than that
    "late_exif_huge.png": lambda: _IHDR + _IDAT + _png_chunk(b"eXIf", b"MM\x00*" + b"\xff" * (64 << 20)),
    "late_exif_garbage.png": lambda: _IHDR + _IDAT + _png_chunk(b"eXIf", os.urandom(4096)),
    "late_exif_after_a_flood.png": lambda: (
        _IHDR
        + _IDAT
        + _png_chunk(b"tEXt", b"") * (FLOOD // 12)
        + _png_chunk(b"eXIf", b"MM\x00*\x00\x00\x00\x08\x00\x01\x01\x12\x00\x03\x00\x00\x00\x01\x00\x06\x00\x00")
    ),
}


@pytest.mark.parametrize("name", sorted(LATE_EXIF))
def test_hostile_late_exif_chunks_answer_within_the_bound(prober, workdir, name):
    result = _probe(prober, _write(workdir, name, LATE_EXIF[name]() + _png_chunk(b"IEND", b"")), name)
    assert result["status"] == "ok", result


def test_garbage_late_exif_prints_nothing_through_the_cli(tmp_path):
    path = tmp_path / "garbage_exif.png"
    exif = b"MM\x00*" + b"\xff" * 64  # IFD0 offset far past the end: Pillow warns "Corrupt EXIF data"
    path.write_bytes(_IHDR + _IDAT + _png_chunk(b"eXIf", exif) + _png_chunk(b"IEND", b""))
    r = run_qvl("bucket-plan", str(path), "--json")
    assert r.exit_code == 0 and r.stderr == "", r.stderr


def test_preallocated_download_is_refused_fast(prober, workdir):
    """A download manager preallocates the file: a real header, then a sparse 1 GiB of zeros."""
    for name, head in (
        ("prealloc.png", _IHDR),
        ("prealloc.jpg", SEEDS["seed.jpg"][:200]),
        ("prealloc.gif", SEEDS["seed.gif"][:40]),
        ("prealloc.mp4", SEEDS["seed.mp4"][:400]),
    ):
        path = workdir / name
        with path.open("wb") as f:
            f.write(head)
            f.truncate(1 << 30)
        result = _probe(prober, path, name)
        if not name.endswith(".gif"):  # GIF has no completeness check: its size is answered from the header
            assert result["status"] == "input_error", (name, result)
        path.unlink()


# --- not regular files, and names ffmpeg would read as a protocol ----------------------------------------


def test_fifo_and_device_are_refused_without_blocking(prober, workdir):
    for ext in (".png", ".mp4"):
        fifo = workdir / f"fifo{ext}"
        os.mkfifo(fifo)
        result = _probe(prober, fifo, str(fifo))  # opening a FIFO for reading would block forever
        assert result["status"] == "input_error" and "not a regular file" in result["detail"], result
    result = _probe(prober, Path("/dev/zero"), "/dev/zero", "video")
    assert result["status"] == "input_error", result


def test_file_named_like_an_ffmpeg_protocol_is_read_as_that_file(tmp_path):
    """``pipe:0`` is a file name here; ffmpeg must not read stdin (or any other protocol) instead of it."""
    import subprocess

    (tmp_path / "pipe:0").write_bytes(SEEDS["seed.mp4"])
    (tmp_path / "concat:pipe:0").write_bytes(SEEDS["seed.mp4"])
    code = (
        "import sys; from qwenvl_rbln.vision import media\n"
        "for name in ('pipe:0', 'concat:pipe:0'):\n"
        "    info = media.probe_video(name)\n"
        "    print(name, info.width, info.height, info.total_frames)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # stdin is a pipe nobody writes to or closes: reading it instead of the file would block
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate(timeout=60)
        pytest.fail("probe_video('pipe:0') read stdin instead of the file named pipe:0")
    finally:
        if proc.stdin and not proc.stdin.closed:
            proc.stdin.close()
    assert proc.returncode == 0, err
    assert out.splitlines() == ["pipe:0 64 48 12", "concat:pipe:0 64 48 12"]


# --- random bytes and random mutations (hypothesis) -------------------------------------------------------

_fuzz = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_fuzz
@given(data=st.binary(max_size=4096), ext=st.sampled_from(fm.ALL_EXTS))
def test_random_bytes(prober, workdir, data, ext):
    _probe(prober, _write(workdir, f"random{ext}", data), f"{len(data)} random bytes as {ext}")


@_fuzz
@given(
    name=st.sampled_from(sorted(SEEDS) + sorted(CRAFTED)),
    seed=st.integers(0, 2**32 - 1),
    steps=st.integers(1, 4),
    ext=st.sampled_from((None, *fm.ALL_EXTS)),
)
def test_mutated_files(prober, workdir, name, seed, steps, ext):
    import random

    rng = random.Random(seed)
    data = SEEDS.get(name) or CRAFTED[name]
    for _ in range(steps):
        data = fm.mutate(rng, data)
    _probe(prober, _write(workdir, f"mutated{ext or Path(name).suffix}", data), f"{name} x{steps} seed {seed}")


def test_fuzz_target_runs_and_reports(tmp_path):
    """The standalone target: N cases (the time budget only a bound here: a loaded machine is slower), cases/s
    and the worker's max RSS, exit 0 when clean."""
    import json
    import subprocess

    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "fuzz_media.py"),
            "--seconds",
            "400",
            "--cases",
            "40",
            "--seed",
            "7",
            "--watchdog",
            str(WATCHDOG_S),
            "--keep",
            str(tmp_path / "keep"),
        ],
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["cases"] == 40 and report["cases_per_s"] > 0
    assert 0 < report["worker_max_rss_mb"] <= MEMORY_MB
    assert report["failures"] == [] and set(report["results"]) <= {"ok", "input_error"}


# --- through the CLI: a directory of hostile files ---------------------------------------------------------


def test_bucket_plan_over_hostile_files_reports_each_and_exits_2(tmp_path):
    d = tmp_path / "inputs"
    d.mkdir()
    (d / "good.png").write_bytes(SEEDS["seed.png"])
    for name in ("huge_ihdr.png", "huge_sof.jpg", "huge_screen.gif", "huge_canvas.webp"):
        (d / name).write_bytes(CRAFTED[name])
    (d / "cut.jpg").write_bytes(SEEDS["seed.jpg"][:300])
    (d / "image_as.mp4").write_bytes(SEEDS["seed.png"])
    (d / "noise.webm").write_bytes(os.urandom(3000))
    r = run_qvl("bucket-plan", "--preset", "rebel100-1npu", str(d), timeout=120)
    assert r.exit_code == 2, r.stdout + r.stderr
    text = r.stdout + r.stderr
    assert "Traceback" not in text and "internal error" not in text
    for name in (
        "huge_ihdr.png",
        "huge_sof.jpg",
        "huge_screen.gif",
        "huge_canvas.webp",
        "cut.jpg",
        "image_as.mp4",
        "noise.webm",
    ):
        assert name in text, name
