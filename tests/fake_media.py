"""Small videos the tests write for themselves (PyAV): no media file is shipped for them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def _write_video(path: Path, width: int, height: int, fps: int, frames: list[Any], **options: str) -> Path:
    """An mpeg4 mp4 of the given RGB frames (``options``: the muxer's, e.g. movflags=faststart)."""
    import av

    with av.open(str(path), "w", options=options) as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_noise_video(path: Path, width: int, height: int, frames: int, fps: int, **options: str) -> Path:
    """An mp4 of seeded random frames (``options``: the muxer's, e.g. movflags=faststart)."""
    import numpy as np

    rng = np.random.default_rng(0)
    noise: Callable[[], Any] = lambda: rng.integers(0, 255, (height, width, 3), dtype=np.uint8)  # noqa: E731
    return _write_video(path, width, height, fps, [noise() for _ in range(frames)], **options)


def write_sweep_video(path: Path, frames: int = 20, fps: int = 8) -> Path:
    """A small mp4 (64x64, a red bar that widens each frame): 20 frames at 8 fps sample to 3 temporal patches."""
    import numpy as np

    def bar(i: int) -> Any:
        frame = np.zeros((64, 64, 3), dtype=np.uint8)
        frame[:, : 3 * (i + 1)] = (255, 10 * i, 0)
        return frame

    return _write_video(path, 64, 64, fps, [bar(i) for i in range(frames)])
