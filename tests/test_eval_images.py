"""New-user audit N2: an image with an alpha channel must give `qvl infer` / `qvl eval` / the batch job the pixels
`qvl serve` (vLLM) gives the model. The oracle is vLLM 0.22's own ``ImageMediaIO.load_file`` (the server's image
loader), run in a subprocess with no platform plugin (vllm-rbln's needs the NPU runtime to import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from qwenvl_rbln.inference.inputs import load_image

_VLLM_SIDE = """
import json, sys
from vllm.multimodal.media.image import ImageMediaIO
out = {}
for path in sys.argv[1:]:
    img = ImageMediaIO(image_mode="RGB").load_file(__import__("pathlib").Path(path)).media
    out[path] = [img.mode, list(img.size), img.tobytes().hex()]
print("RESULT " + json.dumps(out))
"""


def _images(folder: Path) -> dict[str, Path]:
    """Modes with and without transparency, as PNG files (what a user's screenshot or logo is)."""
    w, h = 23, 17
    rgba = Image.new("RGBA", (w, h))
    rgba.putdata([((x * 11) % 256, (y * 15) % 256, 90, (x * y * 7) % 256) for y in range(h) for x in range(w)])
    la = Image.new("LA", (w, h))
    la.putdata([((x * 9) % 256, (x + y * 13) % 256) for y in range(h) for x in range(w)])
    pal = Image.new("P", (w, h))
    pal.putpalette([v for i in range(256) for v in (i, 255 - i, (i * 3) % 256)])
    pal.putdata([(x + y * w) % 256 for y in range(h) for x in range(w)])
    pal.info["transparency"] = 5
    half = Image.new("RGBA", (200, 150), (255, 0, 0, 128))  # the audit's image
    images = {"rgba": rgba, "la": la, "p-transparency": pal, "half-red": half, "rgb": rgba.convert("RGB")}
    images["l"] = la.convert("L")
    out = {}
    for name, img in images.items():
        path = folder / f"{name}.png"
        img.save(path, transparency=5) if name == "p-transparency" else img.save(path)
        out[name] = path
    return out


def test_images_with_transparency_get_vllms_pixels(tmp_path):
    paths = _images(tmp_path)
    env = {**os.environ, "VLLM_PLUGINS": "", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _VLLM_SIDE, *map(str, paths.values())],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (result,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    vllm = json.loads(result[len("RESULT ") :])
    for name, path in paths.items():
        ours = load_image(path)
        mode, size, data = vllm[str(path)]
        assert (ours.mode, list(ours.size)) == (mode, size), name
        assert ours.tobytes().hex() == data, f"{name}: qvl's pixels differ from vLLM's"
    with Image.open(paths["half-red"]) as img:
        assert img.convert("RGB").getpixel((0, 0)) == (255, 0, 0)  # dropping alpha (the old path): opaque red
    assert load_image(paths["half-red"]).getpixel((0, 0)) == (255, 127, 127)  # composited on white, as served


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P", "RGB"])
def test_exif_orientation_is_still_applied(mode, tmp_path):
    img = Image.new(mode, (30, 10))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90: width and height swap
    path = tmp_path / "o.png"
    img.save(path, exif=exif)
    assert load_image(path).size == (10, 30)
