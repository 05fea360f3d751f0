"""``--data easy-vqa``: the easy-VQA test set (Victor Zhou, MIT licence), read offline from the installed
``easy-vqa`` package (1.0: 9,673 questions on 1,000 64x64 PNG images, 13 one-word answers).

A smoke set for a real host: one coloured shape per image, questions about its shape, its colour, or yes/no, so
Qwen3-VL-2B should score near the top. Items keep the package's order (``questions.json``), so ``--limit N`` is the
same N items everywhere; ids are ``easy-vqa-test-NNNN`` (the question's position), categories ``shape``, ``color``
and ``yes/no`` by the answer (the generator's three question kinds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import DependencyMissing, InputError

INSTALL = 'pip install "qwenvl-rbln[eval]" (or pip install easy-vqa==1.0; make install adds it)'
SHAPES = frozenset({"circle", "rectangle", "triangle"})
YES_NO = frozenset({"yes", "no"})


def _package() -> Any:
    try:
        import easy_vqa
    except ImportError:
        raise DependencyMissing(
            "--data easy-vqa reads the easy-VQA test set from the easy-vqa package, which is not installed", INSTALL
        ) from None
    return easy_vqa


def category(answer: str) -> str:
    if answer in YES_NO:
        return "yes/no"
    return "shape" if answer in SHAPES else "color"


def items(limit: int | None = None) -> list[Any]:
    """The test questions in the package's order, the first ``limit`` of them."""
    from qwenvl_rbln.evaluation.items import EvalItem

    pkg = _package()
    try:
        texts, answers, image_ids = pkg.get_test_questions()
        paths = pkg.get_test_image_paths()
    except (OSError, ValueError) as exc:
        raise InputError(
            f"the installed easy-vqa package cannot be read ({exc})",
            "reinstall it: pip install --force-reinstall easy-vqa==1.0",
        ) from None
    count = len(texts) if limit is None else min(limit, len(texts))
    out = []
    for i in range(count):
        image = paths.get(image_ids[i])
        if image is None or not Path(image).is_file():
            raise InputError(
                f"easy-vqa question {i} names image {image_ids[i]}, missing from the installed package",
                "reinstall it: pip install --force-reinstall easy-vqa==1.0",
            )
        answer = str(answers[i])
        out.append(
            EvalItem(
                id=f"easy-vqa-test-{i:04d}",
                question=str(texts[i]),
                answers=[answer],
                category=category(answer),
                images=[str(Path(image).absolute())],
            )
        )
    return out
