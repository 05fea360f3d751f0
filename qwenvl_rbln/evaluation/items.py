"""One question of ``qvl eval`` and the request the batch job runs for it (prompt, media)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from qwenvl_rbln.evaluation.scoring import LETTERS

# The instructions lmms-eval appends (vqav2/textvqa/docvqa's post_prompt; MMBench's, after LLaVA-1.5's evaluation)
OPEN_SUFFIX = "Answer the question using a single word or phrase."
CHOICE_SUFFIX = "Answer with the option's letter from the given choices directly."


@dataclass(frozen=True)
class EvalItem:
    """One question: where its media are (absolute), what counts as right, and its category."""

    id: str
    question: str
    answers: list[str]
    choices: list[str] | None = None
    category: str | None = None
    images: list[str] = field(default_factory=list)
    video: str | None = None

    def prompt(self) -> str:
        return prompt_for(self.question, self.choices)

    def request(self) -> dict[str, Any]:
        """The batch job's line for this item (``qvl infer --batch-file``'s keys)."""
        line: dict[str, Any] = {"id": self.id, "prompt": self.prompt()}
        if self.images:
            line["images"] = list(self.images)
        if self.video:
            line["video"] = self.video
        return line


@dataclass(frozen=True)
class Dataset:
    name: str  # "easy-vqa" or the file as given
    items: list[EvalItem]


def prompt_for(question: str, choices: list[str] | None) -> str:
    """The question, the options lettered A., B., ... (multiple choice), and the task kind's instruction."""
    if not choices:
        return f"{question}\n{OPEN_SUFFIX}"
    options = "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))
    return f"{question}\n{options}\n{CHOICE_SUFFIX}"
