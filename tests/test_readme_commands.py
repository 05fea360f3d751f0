"""Issue 47 item 8: the README is a newcomer's map, and every command it shows runs as written.

Each ``qvl`` command in a shell block of the README, and of every docs/ page (where its reference moved), is parsed
by its own Typer definition, as ``qvl`` parses it before it runs anything: the subcommand exists, every option is one
it declares, every value parses to the option's type. Nothing runs (no engine, no compile, no file read). Where a
dry run is cheap it runs too: the README's serve and deploy lines here, on a stand-in artifact, and its compile dry
runs in ``tests/test_cli_contract.py::test_readme_examples_work_when_pasted``. The pages' links
must name a file of the repository and, with ``#anchor``, one of its headings; and the map keeps its shape: the
two commands first, then each task with a quick start of at most three lines and the page that goes deeper."""

from __future__ import annotations

import re
import shlex
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The README and every page it leads to (its reference moved to docs/).
PAGES = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
TASKS = (  # the README's quick starts, in order (issue 47 item 8)
    "Try it without an NPU",
    "Compile and check",
    "Infer",
    "Serve on one NPU or all",
    "Size for latency targets",
    "Check accuracy",
    "Deploy to a cluster",
)
MAX_README_WORDS = 2000  # a map, not the reference: what goes deeper belongs in docs/
OPERATORS = set("();<>|&")


def code_blocks(text: str) -> list[str]:
    """The shell blocks of a page (```bash)."""
    return [body for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, re.S) if lang in ("bash", "sh", "shell")]


def _lex(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def _logical_lines(block: str) -> list[str]:
    """The block's lines, a backslash-continued line joined to the next, and a quote left open (a JSON body over
    several lines) closed on a later line, as bash reads them."""
    out, pending = [], ""
    for line in re.sub(r"\\\n\s*", " ", block).splitlines():
        pending = f"{pending}\n{line}" if pending else line
        try:
            _lex(pending)
        except ValueError:  # no closing quotation yet
            continue
        out.append(pending)
        pending = ""
    return [*out, pending] if pending else out


def shell_commands(block: str) -> list[list[str]]:
    """Every simple command of a shell block, as words: lines continued with a backslash joined, comments cut,
    split at ``&&``, ``|``, ``;`` and ``$( )``, redirections and leading ``NAME=value`` assignments dropped."""
    commands: list[list[str]] = []
    for line in _logical_lines(block):
        words: list[str] = []
        tokens = iter(_lex(line))
        for token in tokens:
            if set(token) <= OPERATORS:
                if token in (">", ">>", "<", "2>"):
                    next(tokens, None)  # the file a redirection names
                    continue
                commands.append(words)
                words = []
            else:
                words.append(token)
        commands.append(words)
    out = []
    for words in commands:
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            words = words[1:]
        if words:
            out.append(words)
    return out


def qvl_commands(text: str) -> list[list[str]]:
    return [words for block in code_blocks(text) for words in shell_commands(block) if words[0] == "qvl"]


@cache
def _root() -> Any:
    import typer

    from qwenvl_rbln.cli import full_app

    return typer.main.get_command(full_app())


def parse_error(words: list[str]) -> str | None:
    """Why ``qvl`` would refuse these words before running anything (None: it would not)."""
    command, path, rest = _root(), ["qvl"], list(words[1:])
    while hasattr(command, "commands"):  # the root, or a group such as `qvl cache`
        if not rest or rest[0] not in command.commands:
            return f"{' '.join(path)}: no command {rest[0] if rest else '(none)'}"
        path.append(rest[0])
        command, rest = command.commands[rest[0]], rest[1:]
    try:
        command.make_context(" ".join(path), rest)  # parses and converts every value; calls no command
    except Exception as exc:  # the parser's UsageError (Typer vendors click, so its class is Typer's own)
        if not hasattr(exc, "format_message"):
            raise
        return f"{' '.join(path)}: {exc.format_message()}"
    return None


def _page_commands() -> list[tuple[str, list[str]]]:
    return [(page, words) for page in PAGES for words in qvl_commands((ROOT / page).read_text(encoding="utf-8"))]


def test_every_qvl_command_on_the_pages_parses():
    found = _page_commands()
    readme = [words for page, words in found if page == "README.md"]
    assert len(readme) >= 18 and len(found) >= 70, (len(readme), len(found))  # the reader still reads the blocks
    assert {words[1] for words in readme} >= {"compile", "infer", "serve", "tune", "eval", "deploy", "load-check"}
    refused = [f"{page}: {shlex.join(words)}\n  -> {err}" for page, words in found if (err := parse_error(words))]
    assert not refused, "commands qvl would refuse as written:\n" + "\n".join(refused)


@pytest.mark.parametrize(
    "line, why",
    [
        ("qvl compile --preset rebel100-1npu --dry-rnu", "No such option: --dry-rnu"),
        ("qvl serve qvl-out/x --worker 4", "No such option: --worker"),
        ("qvl tune -w sizes.jsonl --context 32k", "'--context'"),
        ("qvl cache purge", "no command purge"),
        ("qvl compil --preset cpu-tiny", "no command compil"),
        ("qvl infer --image", "requires an argument"),
    ],
)
def test_a_misspelt_command_is_refused(line, why):
    """Positive control: the checker refuses what qvl refuses, and names it."""
    (words,) = shell_commands(line)
    err = parse_error(words)
    assert err and why in err, err


def test_the_reader_splits_shell_lines_as_bash_does():
    block = (
        "VLLM_API_KEY=$(cat key.txt) qvl serve out --host 0.0.0.0 -- --enforce-eager  # a comment\n"
        "qvl compile --preset p && qvl serve --emulate\n"
        "qvl load-check out --json > load.json\n"
        "qvl deploy out --artifact pvc:c \\\n    --image R/v:T -o k8s\n"
        "qvl compile --preset p --set 'visual.max_seq_len=[1,2]' --json | jq .rbln_config\n"
    )
    assert [w for w in shell_commands(block) if w[0] == "qvl"] == [
        ["qvl", "serve", "out", "--host", "0.0.0.0", "--", "--enforce-eager"],
        ["qvl", "compile", "--preset", "p"],
        ["qvl", "serve", "--emulate"],
        ["qvl", "load-check", "out", "--json"],
        ["qvl", "deploy", "out", "--artifact", "pvc:c", "--image", "R/v:T", "-o", "k8s"],
        ["qvl", "compile", "--preset", "p", "--set", "visual.max_seq_len=[1,2]", "--json"],
    ]


# ------------------------------------------------------------------------------------------------ the map's shape


def _sections(text: str) -> dict[str, str]:
    """Each `##` section of the README: its heading and its text up to the next heading."""
    parts = re.split(r"^(#{2,3}) (.+)$", text, flags=re.M)
    return {parts[i + 1].strip(): parts[i + 2] for i in range(1, len(parts) - 2, 3) if parts[i] == "##"}


def test_the_readme_starts_with_the_two_commands_then_maps_each_task():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first = code_blocks(text)[0]
    assert [line.split()[:2] for line in first.strip().splitlines()] == [["make", "demo"], ["make", "test"]]
    assert len(text.split()) <= MAX_README_WORDS, f"README has {len(text.split())} words: move reference to docs/"
    first_screen = text[: text.index("\n## ")]  # the title, the two commands, one paragraph, the list of tasks
    sections = _sections(text)
    assert list(sections)[: len(TASKS)] == list(TASKS)
    for task in TASKS:
        assert f"](#{slug(task)})" in first_screen, f"the first screen does not link {task!r}"
        body = sections[task]
        (quick,) = code_blocks(body)  # one quick start per task
        lines = [line for line in quick.strip().splitlines() if line.strip()]
        assert 1 <= len(lines) <= 3, (task, lines)
        assert re.search(r"\]\(docs/[\w-]+\.md", body), f"{task!r} names no page that goes deeper"


# ---------------------------------------------------------------------------------------------------- the links


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def broken_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):  # http:, mailto:: not this repository's
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in _anchors(path)):
            broken.append(target)
    return broken


def test_every_link_on_the_pages_names_a_file_and_a_heading_that_exist():
    links = sum(len(re.findall(r"\]\(", (ROOT / page).read_text(encoding="utf-8"))) for page in PAGES)
    assert links >= 50, links
    broken = {page: b for page in PAGES if (b := broken_links(ROOT / page))}
    assert not broken, broken


def test_the_link_checker_sees_a_broken_link(tmp_path):
    """Positive control: a missing file and a missing heading are reported, a present one is not."""
    (tmp_path / "a.md").write_text("# Top\n\n## Some `code` (here)\n")
    page = tmp_path / "p.md"
    page.write_text("[ok](a.md#some-code-here) [no](a.md#nowhere) [gone](b.md) [self](#p) [web](https://x.y/#z)\n# P\n")
    assert broken_links(page) == ["a.md#nowhere", "b.md"]


# ------------------------------------------------------------------------------------- dry runs where they are cheap


def test_the_readmes_serve_and_deploy_lines_run_as_dry_runs(tmp_path, capsys, monkeypatch):
    """The serve and deploy quick starts, run as written plus ``--dry-run`` on a stand-in artifact at the paths they
    name (an optimum-rbln layout and manifest; the load-check report the deploy line reads): qvl accepts them."""
    import json

    from qwenvl_rbln.artifacts.manifest import graph_hash, read_manifest, write_manifest
    from qwenvl_rbln.planning.plan import build_plan
    from tests.fakes_rbln import run_main, write_artifact

    monkeypatch.setenv("QVL_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    readme = qvl_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    lines = [w for w in readme if w[1] in ("serve", "deploy") and "--emulate" not in w]
    assert {w[1] for w in lines} == {"serve", "deploy"}, lines
    plan = build_plan("rebel100-1npu")
    for words in lines:
        art = Path(words[2])
        if not art.exists():
            write_artifact(art, plan)
            model = {"id": "Qwen/Qwen3-VL-2B-Instruct"}
            write_manifest(art, {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": model})
        if "--load-check" in words:
            loaded = {"ok": True, "create_runtimes": True, "seconds": 95.0}
            runtime = {**loaded, "graph_hash": graph_hash(art, read_manifest(art))}
            report = {"artifact_dir": str(art), "emulated": False, "runtime": runtime}
            Path(words[words.index("--load-check") + 1]).write_text(json.dumps(report))
        code, _, err = run_main([*words[1:], "--dry-run"], capsys)
        assert code == 0, (shlex.join(words), err)
