"""YAML with the reasons in it: a small block-style emitter whose values may carry a comment (``Note``).

pyyaml's ``safe_dump`` cannot write comments, and every field ``qvl deploy`` sets must say why it is set, so the
objects are built as plain data with ``Note(value, why)`` where a reason belongs, and written here. Each scalar is
spelled by ``yaml.safe_dump`` itself (quoting, escapes), and ``plain`` strips the notes: the tests load every file
back with ``yaml.safe_load`` and compare it with ``plain(data)``.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any

WIDTH = 116  # comment lines wrap here (the project's 120 columns, less the indentation of most of them)


@dataclass(frozen=True)
class Note:
    """A value with the reason it is set, written as ``# why`` lines above its key (or list item)."""

    value: Any
    why: str


def plain(value: Any) -> Any:
    """The data without its notes: what ``yaml.safe_load`` reads back from ``dump``."""
    if isinstance(value, Note):
        return plain(value.value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def comment(text: str, indent: int = 0) -> list[str]:
    """``text`` as comment lines at ``indent`` (paragraphs split on blank lines)."""
    pad = " " * indent
    lines: list[str] = []
    for para in text.split("\n"):
        wrapped = textwrap.wrap(para, max(40, WIDTH - indent - 2), break_on_hyphens=False, break_long_words=False)
        wrapped = wrapped or [""]
        lines += [f"{pad}# {line}".rstrip() for line in wrapped]
    return lines


def scalar(value: Any) -> str:
    """One scalar as YAML spells it in flow context (quoted where it must be)."""
    import yaml

    style = '"' if isinstance(value, str) and ("\n" in value or "\r" in value) else None  # one line, escaped
    text = yaml.safe_dump([value], default_flow_style=True, width=10**9, allow_unicode=False, default_style=style)
    return text.strip()[1:-1]


def _is_block(value: Any) -> bool:
    return isinstance(value, dict | list) and bool(value)


def _literal(value: Any) -> bool:
    """A multi-line text that a ``|`` block keeps exactly: one final newline, no tabs, no trailing blanks."""
    if not isinstance(value, str) or "\n" not in value[:-1] or not value.endswith("\n") or value.endswith("\n\n"):
        return False
    lines = value[:-1].split("\n")
    return (
        lines[0].strip() != ""
        and not lines[0].startswith(" ")
        and all("\t" not in line and "\r" not in line and line == line.rstrip() for line in lines)
    )


def _empty(value: Any) -> str:
    return "{}" if isinstance(value, dict) else "[]"


def _mapping(data: dict, indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    for key, value in data.items():
        if isinstance(value, Note):
            lines += comment(value.why, indent)
            value = value.value
        head = f"{pad}{scalar(key)}:"
        if _literal(value):  # a file's text (a YAML document inside a values file): readable as it is
            lines.append(f"{head} |")
            lines += [f"{pad}  {line}" if line else "" for line in value[:-1].split("\n")]
        elif _is_block(value):
            lines.append(head)
            lines += _block(value, indent + 2)
        else:
            lines.append(f"{head} {_empty(value) if isinstance(value, dict | list) else scalar(value)}")
    return lines


def _sequence(data: list, indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    for item in data:
        if isinstance(item, Note):
            lines += comment(item.why, indent)
            item = item.value
        if isinstance(item, dict) and item:
            inner = _mapping(item, indent + 2)
            first = next(i for i, line in enumerate(inner) if not line.lstrip().startswith("#"))
            lines += [f"{pad}{line.lstrip()}" for line in inner[:first]]  # a first key's note goes above the dash
            lines.append(f"{pad}- {inner[first][indent + 2 :]}")
            lines += inner[first + 1 :]
        elif _is_block(item):
            lines.append(f"{pad}-")
            lines += _block(item, indent + 2)
        else:
            lines.append(f"{pad}- {_empty(item) if isinstance(item, dict | list) else scalar(item)}")
    return lines


def _block(value: Any, indent: int) -> list[str]:
    return _mapping(value, indent) if isinstance(value, dict) else _sequence(value, indent)


def dump(data: dict, header: str | None = None) -> str:
    """One YAML document (a mapping), with ``header`` as comment lines on top."""
    lines = comment(header) if header else []
    return "\n".join([*lines, *_mapping(data, 0)]) + "\n"
