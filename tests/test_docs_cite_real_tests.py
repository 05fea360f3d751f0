"""docs/reliability.md cites tests by name (`file.py::test`, then `::test` for more in the same file): every one
it cites must exist, so the page never vouches for a case with a test nobody can run. The same holds for every page
under docs/ and the README (the README's reference moved to docs/), and for a test file cited without a name."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


@functools.cache
def _defined(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def cited(text: str) -> list[tuple[str, str]]:
    """(file, test) for each citation; a bare ``::name`` belongs to the file named last in the same table cell."""
    out = []
    for line in text.splitlines():
        for cell in line.split("|"):
            current = None
            for m in re.finditer(r"`([^`]*)`", cell):
                code = m.group(1)
                f = re.match(r"^(?:tests/)?(test_\w+\.py)(?:::(\w+(?:\.\.\.)?))?", code)
                if f:
                    current = f.group(1)
                    if f.group(2):
                        out.append((current, f.group(2)))
                    continue
                bare = re.match(r"^::(\w+(?:\.\.\.)?)", code)
                if bare and current:
                    out.append((current, bare.group(1)))
    return out


def test_every_test_the_docs_cite_exists():
    missing = []
    count = 0
    for doc in DOCS:
        for file, name in cited(doc.read_text(encoding="utf-8")):
            count += 1
            path = ROOT / "tests" / file
            names = _defined(path) if path.is_file() else set()
            prefix = name.removesuffix("...")  # `test_a_cut_png_of_tiny_chunks_...`: a shortened name
            if not (name in names or (name.endswith("...") and any(n.startswith(prefix) for n in names))):
                missing.append(f"{doc.name}: {file}::{name}")
    assert count > 100, f"the citation reader found only {count}: it no longer reads the page"
    assert not missing, "cited tests that do not exist:\n" + "\n".join(missing)


def cited_files(text: str) -> set[str]:
    """Every test file a page names in code (`tests/test_x.py`, `test_x.py::name`), with or without a test."""
    return set(re.findall(r"`(?:tests/)?(test_\w+\.py)\b", text))


def test_every_test_file_the_docs_cite_exists():
    cited_by = {(doc.name, name) for doc in DOCS for name in cited_files(doc.read_text(encoding="utf-8"))}
    assert len({doc for doc, _ in cited_by}) >= 8, cited_by  # the reader still finds the pages' citations
    missing = sorted(f"{doc}: {name}" for doc, name in cited_by if not (ROOT / "tests" / name).is_file())
    assert not missing, "cited test files that do not exist:\n" + "\n".join(missing)


def test_the_reader_sees_a_missing_citation():
    """Positive control: a made-up name is reported, a real one is not."""
    text = "| case | `test_plan.py::test_golden_dicts`, `::test_no_such_test_at_all` |"
    pairs = cited(text)
    assert pairs == [("test_plan.py", "test_golden_dicts"), ("test_plan.py", "test_no_such_test_at_all")]
    defined = _defined(ROOT / "tests" / "test_plan.py")
    assert "test_golden_dicts" in defined and "test_no_such_test_at_all" not in defined
    files = cited_files("as `tests/test_plan.py` and `test_no_such_file.py::test_x` show")
    assert files == {"test_plan.py", "test_no_such_file.py"}
    assert not (ROOT / "tests" / "test_no_such_file.py").is_file()
