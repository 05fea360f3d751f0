"""Fuzz target for qvl's header-only media probing (``media.probe_image`` / ``media.probe_video``).

Every input qvl is handed (``bucket-plan`` paths, ``infer --image/--video``, request files) goes through
these two functions first, so they must survive anything: random bytes, files cut short at any byte, the
wrong extension, and headers that declare absurd sizes (a PNG of 2^31-1 x 2^31-1, a JPEG of 65535 x 65535).
The contract: a result or an ``InputError`` -- never another exception, never more than 2 s of CPU, never more than
512 MiB of address space.

Each probe runs in a worker subprocess with ``RLIMIT_AS`` set (the memory bound), a ``setitimer`` alarm
inside the worker (the bound on CPU time for Python code: CPU, not wall, so a busy machine cannot fail a
probe that did bounded work) and a watchdog in the parent that kills the worker
when it does not answer (the bound for a hang inside C code). ``tests/test_fuzz_media.py`` imports this file
for its case generators and the ``Prober``.

Usage::

    python benchmarks/fuzz_media.py --seconds 30 [--seed 1] [--memory-mb 512] [--timeout 2] [--keep DIR]

prints one JSON document: cases run, cases/s, result counts, the slowest probe, the worker's max RSS, and
every failure (exit 1 when there is one; the failing inputs are kept under --keep).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import resource
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
IMAGE_EXTS = (".png", ".jpg", ".gif", ".webp", ".bmp", ".tiff")
VIDEO_EXTS = (".mp4", ".mkv", ".webm", ".avi", ".mov")
ALL_EXTS = IMAGE_EXTS + VIDEO_EXTS
OK, INPUT_ERROR = "ok", "input_error"
READY = "ready"  # the worker's first line: started, limits in place
START_S = 300.0  # a fresh worker's bound to say READY (a bound on a loaded machine, not part of any probe's time)
# Everything else is a failure: "crash" (another exception), "timeout" (alarm in the worker), "hang" (the
# worker did not answer and was killed), "memory" (MemoryError / ENOMEM), "died" (the worker exited).
FAILURES = ("crash", "timeout", "hang", "memory", "died")


# ------------------------------------------------------------------------------------------- seed files


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _image_bytes(fmt: str, size: tuple[int, int] = (96, 64), **kw) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    img = Image.new("RGB", size, (40, 90, 160))
    for x in range(0, size[0], 7):  # some structure, so the encoders emit real data
        img.putpixel((x, x % size[1]), (255, 255, 0))
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _video_bytes(
    ext: str, codec: str, *, faststart: bool = False, size: tuple[int, int] = (64, 48), frames: int = 12
) -> bytes:
    import av
    import numpy as np

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"v{ext}"
        options = {"movflags": "faststart"} if faststart else {}
        with av.open(str(path), "w", options=options) as container:
            stream = container.add_stream(codec, rate=10)
            stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
            for i in range(frames):
                pixels = np.full((size[1], size[0], 3), (i * 20) % 256, np.uint8)
                for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        return path.read_bytes()


def seed_files() -> dict[str, bytes]:
    """Valid files, name (with its true extension) -> bytes."""
    seeds = {
        "seed.png": _image_bytes("PNG"),
        "seed.jpg": _image_bytes("JPEG", quality=80),
        "seed_progressive.jpg": _image_bytes("JPEG", progressive=True),
        "seed.gif": _image_bytes("GIF"),
        "seed.webp": _image_bytes("WEBP", quality=60),
        "seed_lossless.webp": _image_bytes("WEBP", lossless=True),
        "seed.bmp": _image_bytes("BMP"),
        "seed.tiff": _image_bytes("TIFF"),
    }
    try:
        seeds["seed.mp4"] = _video_bytes(".mp4", "mpeg4")
        seeds["seed_faststart.mp4"] = _video_bytes(".mp4", "mpeg4", faststart=True)
        seeds["seed.mkv"] = _video_bytes(".mkv", "mpeg4")
        seeds["seed.avi"] = _video_bytes(".avi", "mpeg4")
    except ImportError:  # no PyAV: images only
        pass
    return seeds


# ------------------------------------------------------------------------------- crafted huge headers


def png_huge(width: int = 2**31 - 1, height: int = 2**31 - 1) -> bytes:
    """A well-formed PNG whose IHDR declares ``width`` x ``height`` (the spec's maximum by default)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


def jpeg_huge(width: int = 65535, height: int = 65535) -> bytes:
    """A baseline JPEG whose SOF0 declares ``width`` x ``height`` (JPEG's 16-bit maximum by default)."""
    seg = lambda marker, payload: b"\xff" + bytes([marker]) + struct.pack(">H", len(payload) + 2) + payload  # noqa: E731
    app0 = seg(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
    dqt = seg(0xDB, b"\x00" + bytes([1] * 64))
    sof = seg(0xC0, struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00")
    # DC and AC Huffman tables with a single 1-bit code each
    dht = seg(0xC4, b"\x00" + bytes([1] + [0] * 15) + b"\x00") + seg(0xC4, b"\x10" + bytes([1] + [0] * 15) + b"\x00")
    sos = seg(0xDA, b"\x01\x01\x00\x00\x3f\x00")
    return b"\xff\xd8" + app0 + dqt + sof + dht + sos + b"\x00" * 32 + b"\xff\xd9"


def gif_huge(width: int = 65535, height: int = 65535) -> bytes:
    """A GIF89a whose logical screen and first image descriptor declare ``width`` x ``height``."""
    header = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    descriptor = b"\x2c" + struct.pack("<HHHHB", 0, 0, width, height, 0)
    return header + descriptor + b"\x02\x02\x44\x01\x00" + b"\x3b"


def webp_huge(width: int = 1 << 24, height: int = 1 << 24) -> bytes:
    """An extended-format WebP whose VP8X chunk declares a ``width`` x ``height`` canvas (2^24 maximum)."""
    vp8x = b"VP8X" + struct.pack("<I", 10) + b"\x00\x00\x00\x00"
    vp8x += (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    vp8l = b"VP8L" + struct.pack("<I", 6) + b"\x2f" + b"\x00" * 5
    body = b"WEBP" + vp8x + vp8l
    return b"RIFF" + struct.pack("<I", len(body)) + body


def bmp_huge(width: int = 2**31 - 1, height: int = 2**31 - 1) -> bytes:
    """A BMP whose BITMAPINFOHEADER declares ``width`` x ``height``."""
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, 0, 2835, 2835, 0, 0)
    pixels = b"\x00" * 64
    header = b"BM" + struct.pack("<IHHI", 14 + len(info) + len(pixels), 0, 0, 14 + len(info))
    return header + info + pixels


def tiff_huge(width: int = 2**32 - 1, height: int = 2**32 - 1) -> bytes:
    """A little-endian TIFF whose first IFD declares ``width`` x ``height``."""
    entries = [
        (256, 4, 1, width),  # ImageWidth, LONG
        (257, 4, 1, height),  # ImageLength
        (258, 3, 1, 8),  # BitsPerSample
        (259, 3, 1, 1),  # Compression: none
        (262, 3, 1, 1),  # Photometric: black is zero
        (273, 4, 1, 8),  # StripOffsets
        (277, 3, 1, 1),  # SamplesPerPixel
        (278, 4, 1, height),  # RowsPerStrip
        (279, 4, 1, 16),  # StripByteCounts
    ]
    ifd = struct.pack("<H", len(entries))
    for tag, typ, count, value in entries:
        packed = struct.pack("<HHI", tag, typ, count)
        packed += struct.pack("<HH", value, 0) if typ == 3 else struct.pack("<I", value)
        ifd += packed
    ifd += struct.pack("<I", 0)
    return b"II*\x00" + struct.pack("<I", 8) + ifd + b"\x00" * 16


def mp4_huge(seed_mp4: bytes, width: int = 65535, height: int = 65535) -> bytes:
    """A real mp4 with the visual sample entry (stsd/mp4v) and the track header patched to ``width`` x ``height``."""
    data = bytearray(seed_mp4)
    pos = data.find(b"mp4v")
    if pos >= 0:  # VisualSampleEntry: type, 6 reserved, data_ref, 16 pre_defined/reserved, then width, height
        struct.pack_into(">HH", data, pos + 28, width, height)
    pos = data.find(b"tkhd")
    if pos >= 0:  # width and height (16.16 fixed) are the last 8 bytes of the box
        size = struct.unpack(">I", data[pos - 4 : pos])[0]
        struct.pack_into(">II", data, pos - 4 + size - 8, width << 16, height << 16)
    return bytes(data)


def crafted_files(seeds: dict[str, bytes] | None = None) -> dict[str, bytes]:
    """Headers declaring huge sizes: name -> bytes (every one must be refused or answered from the header)."""
    out = {
        "huge_ihdr.png": png_huge(),
        "huge_ihdr_wide.png": png_huge(2**31 - 1, 1),
        "huge_sof.jpg": jpeg_huge(),
        "huge_screen.gif": gif_huge(),
        "huge_canvas.webp": webp_huge(),
        "huge_info.bmp": bmp_huge(),
        "huge_negative_height.bmp": bmp_huge(2**31 - 1, -(2**31)),
        "huge_ifd.tiff": tiff_huge(),
        "zero_ihdr.png": png_huge(0, 0),
        "zero_sof.jpg": jpeg_huge(0, 0),
    }
    if seeds and "seed.mp4" in seeds:
        out["huge_stsd.mp4"] = mp4_huge(seeds["seed.mp4"])
        out["zero_stsd.mp4"] = mp4_huge(seeds["seed.mp4"], 0, 0)
    return out


# ------------------------------------------------------------------------------------------- mutations


def truncation_points(length: int, every: int) -> list[int]:
    """Every ``every``-th byte, plus the first 16 and the last 4 offsets (header and trailer edges)."""
    points = set(range(0, length, max(1, every))) | set(range(min(16, length))) | set(range(max(0, length - 4), length))
    return sorted(points)


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One random structural mutation: bit flips, 0xFF runs over a field, a cut, a duplicated or deleted span."""
    buf = bytearray(data)
    if not buf:
        return bytes(rng.randbytes(rng.randint(1, 64)))
    op = rng.randrange(6)
    if op == 0:  # flip a few bits, biased to the header
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(min(len(buf), 256)) if rng.random() < 0.7 else rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
    elif op == 1:  # overwrite a 2-4 byte field with 0xFF (huge lengths / sizes)
        i = rng.randrange(len(buf))
        buf[i : i + rng.choice((2, 4))] = b"\xff" * rng.choice((2, 4))
    elif op == 2:  # cut
        del buf[rng.randrange(len(buf)) :]
    elif op == 3:  # duplicate a span
        i = rng.randrange(len(buf))
        j = min(len(buf), i + rng.randint(1, 512))
        buf[j:j] = buf[i:j] * rng.randint(1, 8)
    elif op == 4:  # delete a span
        i = rng.randrange(len(buf))
        del buf[i : i + rng.randint(1, 256)]
    else:  # zero a field (zero sizes, zero lengths)
        i = rng.randrange(len(buf))
        buf[i : i + 4] = b"\x00" * 4
    return bytes(buf)


def random_case(rng: random.Random, seeds: dict[str, bytes], crafted: dict[str, bytes]) -> tuple[str, bytes, str]:
    """(extension, bytes, label) of one random case: noise, a mutated seed, a truncation, or a wrong extension."""
    kind = rng.randrange(10)
    names = sorted(seeds)
    if kind == 0:
        n = rng.choice((0, 1, 7, 64, 512, 4096))
        return rng.choice(ALL_EXTS), rng.randbytes(n), f"random {n} bytes"
    if kind == 1:
        name = rng.choice(names)
        magic = seeds[name][:16]
        return rng.choice(ALL_EXTS), magic + rng.randbytes(rng.randint(0, 2048)), f"{name} magic + noise"
    if kind == 2:
        name = rng.choice(sorted(crafted))
        return Path(name).suffix, mutate(rng, crafted[name]), f"mutated {name}"
    name = rng.choice(names)
    data = seeds[name]
    if kind == 3:
        cut = rng.randrange(len(data))
        return Path(name).suffix, data[:cut], f"{name} cut at {cut}"
    if kind == 4:
        ext = rng.choice([e for e in ALL_EXTS if e != Path(name).suffix])
        return ext, data, f"{name} as {ext}"
    steps = rng.randint(1, 3)
    for _ in range(steps):
        data = mutate(rng, data)
    return Path(name).suffix, data, f"{name} with {steps} mutation(s)"


# ---------------------------------------------------------------------------------------------- worker


def _peak_rss_mb() -> float:
    """This process's peak RSS. VmHWM, not ru_maxrss: Linux carries ru_maxrss over fork and exec, so a worker
    started from a large parent (a pytest run that loaded torch) would report the parent's peak."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


class _Alarm(BaseException):  # not an Exception: qvl's own `except Exception` must not swallow it
    pass


def _worker_main(memory_mb: int, timeout_s: float, selftest: bool) -> None:
    """Read one JSON request per line on stdin, answer one JSON line on stdout."""
    sys.path.insert(0, str(REPO))
    import av  # noqa: F401  (import before the limit: the probe's own memory is what is bounded)
    import PIL.Image  # noqa: F401

    from qwenvl_rbln.errors import InputError
    from qwenvl_rbln.vision import media

    if memory_mb > 0:
        limit = memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    def on_alarm(signum, frame):  # noqa: ANN001
        raise _Alarm

    signal.signal(signal.SIGPROF, on_alarm)
    out = sys.stdout
    out.write(READY + "\n")  # imports done, limits set: the prober's watchdog counts from here, not from the start
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        path, kind = req["path"], req.get("kind") or media.classify(req["path"])
        t0 = time.process_time()
        result: dict = {}
        signal.setitimer(signal.ITIMER_PROF, timeout_s)
        try:
            if selftest and kind == "selftest-spin":
                end = time.process_time() + timeout_s * 3
                while time.process_time() < end:  # busy: the CPU-time alarm must stop it
                    pass
            elif selftest and kind == "selftest-hang":
                signal.setitimer(signal.ITIMER_PROF, 0)
                signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGPROF])
                time.sleep(3600)  # simulates a hang inside C code: no alarm can interrupt it
            elif selftest and kind == "selftest-alloc":
                blob = bytearray(memory_mb << 21)  # twice the limit
                del blob
            elif selftest and kind == "selftest-crash":
                raise ZeroDivisionError("selftest")
            elif selftest and kind == "selftest-enomem":  # what ffmpeg says for an absurd declared size
                raise InputError(f"{path}: not a readable video ([Errno 12] Cannot allocate memory)", "selftest")
            elif selftest and kind == "selftest-enomem-real":  # a real (touched) 300 MiB allocation
                try:
                    blob = b"\x01" * (300 << 20)
                except MemoryError:
                    raise InputError(f"{path}: [Errno 12] Cannot allocate memory", "selftest") from None
                del blob
            info = media.probe_video(path) if kind == "video" else media.probe_image(path)
            result = {"status": OK, "detail": f"{info.width}x{info.height}"}
        except _Alarm:
            result = {"status": "timeout", "detail": f"no answer within {timeout_s}s"}
        except InputError as exc:
            text = exc.one_line()
            result = {
                "status": INPUT_ERROR,
                "detail": text,
                "hint": bool(exc.hint),
                "newline": "\n" in text,
                "enomem": "allocate memory" in text or "MemoryError" in text,
            }
        except MemoryError:
            result = {"status": "memory", "detail": "MemoryError"}
        except BaseException as exc:  # noqa: BLE001 - anything else is exactly what the fuzzer looks for
            result = {"status": "crash", "detail": f"{type(exc).__name__}: {exc}"[:300]}
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
        result["seconds"] = round(time.process_time() - t0, 4)  # CPU seconds: load on the box does not count
        result["maxrss_mb"] = _peak_rss_mb()
        out.write(json.dumps(result) + "\n")
        out.flush()


class Prober:
    """Probes files in a bounded worker subprocess; restarts it after a hang or a death.

    ``probe(path, kind=None)`` -> ``{"status", "detail", "seconds", "maxrss_mb", ...}``; kind is "image",
    "video" or None (by extension, as qvl does). Two wall-clock bounds: ``start_s`` for a fresh worker to say it is
    ready (imports, limits: slow on a loaded machine, and no probe's fault), then ``watchdog_s`` per probe (a
    worker stuck where the CPU-time alarm cannot reach is a hang).
    """

    def __init__(
        self,
        memory_mb: int = 512,
        timeout_s: float = 2.0,
        *,
        selftest: bool = False,
        watchdog_s: float | None = None,
        start_s: float = START_S,
        recheck: bool = True,
    ):
        self.memory_mb = memory_mb
        self.timeout_s = timeout_s
        self.selftest = selftest
        self.watchdog_s = watchdog_s if watchdog_s is not None else timeout_s + 8.0
        self.start_s = start_s
        self.recheck = recheck  # ENOMEM answers probed again with more room (not by the roomier prober itself)
        self.proc: subprocess.Popen | None = None
        self.max_rss_mb = 0.0
        self.restarts = 0

    def _start(self) -> dict | None:
        """A fresh worker, ready (None), or the answer for a worker that never said it started."""
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            "--memory-mb",
            str(self.memory_mb),
            "--timeout",
            str(self.timeout_s),
        ]
        if self.selftest:
            cmd.append("--selftest")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1, env=env
        )
        ready, _, _ = select.select([self.proc.stdout], [], [], self.start_s)
        line = self.proc.stdout.readline() if ready else ""
        if line.strip() == READY:
            return None
        rc = self.proc.poll()
        self._kill()
        return {
            "status": "died",
            "detail": f"worker did not start within {self.start_s}s (exit {rc})",
            "seconds": 0.0,
            "maxrss_mb": 0.0,
        }

    def _kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout):
                with contextlib.suppress(OSError):
                    stream.close()
        self.proc = None

    def probe(self, path: str | Path, kind: str | None = None) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                self.restarts += 1
            self._kill()
            failed = self._start()
            if failed is not None:
                return failed
        assert self.proc is not None and self.proc.stdin and self.proc.stdout
        t0 = time.perf_counter()
        try:
            self.proc.stdin.write(json.dumps({"path": str(path), "kind": kind}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self._kill()
            return {"status": "died", "detail": "worker gone before the request", "seconds": 0.0, "maxrss_mb": 0.0}
        ready, _, _ = select.select([self.proc.stdout], [], [], self.watchdog_s)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            rc = self.proc.poll()
            self._kill()
            self.restarts += 1
            status = "hang" if rc is None else "died"
            seconds = round(time.perf_counter() - t0, 3)
            return {
                "status": status,
                "detail": f"worker {'killed after' if rc is None else f'exited {rc} in'} {seconds}s",
                "seconds": seconds,
                "maxrss_mb": 0.0,
            }
        result = json.loads(line)
        self.max_rss_mb = max(self.max_rss_mb, result.get("maxrss_mb", 0.0))
        if result.pop("enomem", False) and self.memory_mb > 0 and self.recheck:
            result = self._recheck_enomem(path, kind, result)
        return result

    def _recheck_enomem(self, path: str | Path, kind: str | None, result: dict) -> dict:
        """ENOMEM under the limit: a real allocation that hit RLIMIT_AS, or ffmpeg refusing an absurd declared
        size without allocating it? Probe again with 8x the room and look at the peak RSS."""
        with Prober(
            self.memory_mb * 8, self.timeout_s, selftest=self.selftest, watchdog_s=self.watchdog_s, recheck=False
        ) as roomy:
            again = roomy.probe(path, kind)
        if again["status"] == OK or again.get("maxrss_mb", 0.0) > self.memory_mb:
            return {
                **result,
                "status": "memory",
                "detail": f"needs more than {self.memory_mb} MiB (peak {again.get('maxrss_mb')} MiB with 8x the "
                f"room): {result['detail']}",
            }
        result["detail"] += f" [ENOMEM without allocating: peak {again.get('maxrss_mb')} MiB]"
        return result

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None and self.proc.stdin:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()

    def __enter__(self) -> Prober:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def is_failure(result: dict, timeout_s: float, memory_mb: int) -> bool:
    """The contract, checked on one answer: a result or an InputError, within the time and memory bounds."""
    if result["status"] not in (OK, INPUT_ERROR):
        return True
    if result["status"] == INPUT_ERROR and (not result.get("hint") or result.get("newline")):
        return True
    return result["seconds"] > timeout_s or result.get("maxrss_mb", 0) > memory_mb


# ------------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="time budget (default 20)")
    ap.add_argument("--cases", type=int, default=0, help="stop after this many cases (0: time budget only)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: time based, printed)")
    ap.add_argument("--memory-mb", type=int, default=512, help="RLIMIT_AS of the worker in MiB (default 512)")
    ap.add_argument("--timeout", type=float, default=2.0, help="CPU seconds allowed per probe (default 2)")
    ap.add_argument("--keep", type=Path, default=None, help="directory to copy failing inputs into")
    ap.add_argument(
        "--watchdog", type=float, default=None, help="wall seconds before a probe counts as hung (default timeout + 8)"
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--selftest", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker_main(args.memory_mb, args.timeout, args.selftest)
        return 0

    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    seeds = seed_files()
    crafted = crafted_files(seeds)
    counts: Counter[str] = Counter()
    failures: list[dict] = []
    slowest = {"seconds": 0.0}
    t0 = time.perf_counter()
    n = 0
    with (
        tempfile.TemporaryDirectory(prefix="qvl-fuzz-") as work,
        Prober(args.memory_mb, args.timeout, watchdog_s=args.watchdog) as prober,
    ):
        fixed = [(Path(k).suffix, v, k) for k, v in crafted.items()]
        while True:
            elapsed = time.perf_counter() - t0
            if elapsed >= args.seconds or (args.cases and n >= args.cases):
                break
            ext, data, label = fixed.pop() if fixed else random_case(rng, seeds, crafted)
            path = Path(work) / f"case{n}{ext}"
            path.write_bytes(data)
            result = prober.probe(path)
            n += 1
            counts[result["status"]] += 1
            if result["seconds"] > slowest["seconds"]:
                slowest = {"seconds": result["seconds"], "case": label}
            if is_failure(result, args.timeout, args.memory_mb):
                failures.append({"case": label, "ext": ext, "bytes": len(data), **result})
                if args.keep:
                    args.keep.mkdir(parents=True, exist_ok=True)
                    (args.keep / f"fail{len(failures)}{ext}").write_bytes(data)
            path.unlink()
        elapsed = time.perf_counter() - t0
        report = {
            "seed": seed,
            "cases": n,
            "seconds": round(elapsed, 2),
            "cases_per_s": round(n / elapsed, 1) if elapsed else None,
            "results": dict(counts),
            "slowest": slowest,
            "worker_max_rss_mb": prober.max_rss_mb,
            "worker_restarts": prober.restarts,
            "limits": {"memory_mb": args.memory_mb, "timeout_s": args.timeout},
            "failures": failures[:50],
        }
    print(json.dumps(report, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
