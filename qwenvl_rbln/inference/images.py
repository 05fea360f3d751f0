"""An image's mode made RGB the way ``qvl serve`` makes it, so ``qvl infer`` / ``qvl eval`` / the batch job feed the
model the pixels the server does (new-user audit N2: an RGBA PNG got other tokens from serve than from infer)."""

from __future__ import annotations

from typing import Any

WHITE = (255, 255, 255)  # vLLM's rgba_background_color default


def to_rgb(img: Any) -> Any:
    """vLLM 0.22's ``ImageMediaIO`` rule (``vllm/multimodal/media/image.py``, ``rgba_to_rgb``): an RGBA image is
    composited onto white through its alpha; any other mode is ``convert("RGB")`` (LA, PA and a palette's
    transparency lose their alpha there, as in vLLM). transformers' load_image drops RGBA's alpha instead."""
    from PIL import Image

    if img.mode == "RGB":
        return img
    if img.mode == "RGBA":
        out = Image.new("RGB", img.size, WHITE)
        out.paste(img, mask=img.split()[3])
        return out
    return img.convert("RGB")
