"""The CLI contract scripts and people rely on (issue 14): user text printed literally by every human renderer,
one JSON error shape with --json, help that works when pasted.

Everything runs in-process through ``cli.main`` (``run_main``), as a user meets it: exit code, stdout, stderr.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fakes_rbln import run_main

# Each of these was once read as rich markup: '/x' closed a tag that was never opened (MarkupError, exit 1, the
# results lost), '[bold]' vanished, '[red]' coloured the rest of the line.
MARKUP = "[bold]rot[/bold] [/x] [red]"


@pytest.fixture(scope="module")
def tiny() -> Path:
    from qwenvl_rbln.backends.tiny.model import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="module")
def odd(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Files and directories whose names are markup."""
    from PIL import Image

    root = tmp_path_factory.mktemp("markup") / "[bold]proj"
    root.mkdir()
    image = root / "[bold]cat[red].png"
    Image.new("RGB", (96, 64), (200, 30, 30)).save(image)
    preset = root / "[red]preset.yaml"
    preset.write_text(f"extends: rebel100-1npu\ndescription: 'mine {MARKUP}'\n")
    return {"root": root, "image": image, "preset": preset}


def _literal(text: str, *needles: str) -> None:
    for needle in needles:
        assert needle in text, f"{needle!r} not printed literally in:\n{text}"


def test_infer_batch_ids_prompts_and_file_names_are_printed_literally(tiny, odd, capsys, tmp_path):
    batch = tmp_path / "requests.jsonl"
    rows = [
        {"id": "/x", "prompt": f"say {MARKUP}", "images": [str(odd["image"])]},
        {"id": "[bold]rot", "prompt": "hi"},
    ]
    batch.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err = run_main(
        ["infer", str(tiny), "--preset", "cpu-tiny", "--batch-file", str(batch), "--max-new-tokens", "2"], capsys
    )
    assert code == 0, err
    _literal(out, "[/x] ", "[[bold]rot] ", odd["image"].name, "batch 0 [/x, [bold]rot]")
    assert "internal error" not in err


def test_compare_ids_are_printed_literally(tmp_path, capsys):
    doc = {"backend": "torch", "generation": {}, "requests": [{"id": MARKUP, "token_ids": [1, 2]}]}
    a = tmp_path / "[bold]a.json"
    a.write_text(json.dumps(doc))
    b = tmp_path / "b.json"
    b.write_text(json.dumps({**doc, "requests": [{"id": MARKUP, "token_ids": [1, 3]}]}))
    code, out, err = run_main(["compare", str(a), str(b)], capsys)
    assert code == 7, err
    _literal(out, MARKUP, "[bold]a.json")


def test_presets_compile_bucket_plan_and_load_check_print_names_literally(odd, capsys):
    code, out, err = run_main(["presets", "show", str(odd["preset"])], capsys)
    assert code == 0, err
    _literal(out, "[red]preset", MARKUP)
    code, out, err = run_main(
        ["compile", "--preset", str(odd["preset"]), "--dry-run", "-o", str(odd["root"] / "[bold]out")], capsys
    )
    assert code == 0, err
    _literal(out, "[red]preset", f"mine {MARKUP}", "[bold]out")
    code, out, err = run_main(["bucket-plan", "--preset", str(odd["preset"]), str(odd["image"])], capsys)
    assert code == 0, err
    _literal(out, "[red]preset", odd["image"].name[:10])
    code, out, err = run_main(["load-check", str(odd["root"]), "--no-runtime"], capsys)
    assert code == 2
    _literal(err, "[bold]proj")


def test_a_warning_quoting_user_text_is_printed_literally(capsys):
    from qwenvl_rbln.views import render

    render.reset_consoles()
    render.warn(f"request {MARKUP} was capped")
    assert f"warning: request {MARKUP} was capped" in capsys.readouterr().err


def test_markup_fills_fields_literally_with_the_style_around_them():
    from rich.console import Console

    from qwenvl_rbln.views.render import markup

    text = markup("[bold][{}][/bold] {} [dim]{}[/dim]", "/x", "[red]a", "b\\")
    assert text.plain == "[/x] [red]a b\\"
    console = Console(record=True, width=80, color_system="truecolor", force_terminal=True)
    console.print(text)
    assert "[/x] [red]a b\\" in console.export_text()
    with pytest.raises(ValueError):
        markup("{} {}", "one")


# --- one JSON error shape --------------------------------------------------------------------------------------

JSON_FAILURES = [
    (["compile", "--preset", "nope", "--dry-run", "--json"], 2),
    (["compile", "--dry-run", "--set", "max_seq_len", "--json"], 2),
    (["compile", "--dry-run=true", "--json"], 2),  # a usage error, still JSON when --json was given
    (["presets", "show", "nope", "--json"], 2),
    (["bucket-plan", "--size", "0x10", "--json"], 2),
    (["bucket-plan", "--rows", "abc", "--json"], 2),
    (["load-check", "/nonexistent/qvl-artifact", "--no-runtime", "--json"], 2),
    (["compare", "/nonexistent/a.json", "/nonexistent/b.json", "--json"], 2),
    (["infer", "/nonexistent/qvl-artifact", "--prompt", "hi", "--json"], 2),
    (["infer", "--image", "/nonexistent/x.png", "--prompt", "hi", "--json"], 2),
    (["nosuch-command", "--json"], 2),
]


@pytest.mark.parametrize(("argv", "code"), JSON_FAILURES, ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_every_failure_with_json_is_one_error_document_on_stdout(argv, code, capsys):
    got, out, err = run_main(argv, capsys)
    assert got == code, err
    doc = json.loads(out)  # exactly one JSON document
    assert set(doc) == {"error"} and set(doc["error"]) >= {"message", "hint", "exit_code"}
    assert doc["error"]["exit_code"] == code and doc["error"]["message"]
    (line,) = [ln for ln in err.splitlines() if ln.startswith("qvl: ")]  # stderr keeps its line
    assert line.startswith("qvl: error: ")


def test_a_report_that_fails_carries_the_error_in_the_same_document(capsys):
    argv = ["compile", "--preset", "rebel100-1npu-batch4", "--set", "max_seq_len=262144", "--dry-run", "--json"]
    code, out, _ = run_main(argv, capsys)
    assert code == 4
    doc = json.loads(out)
    assert doc["memory"]["fits"] is False and doc["error"]["exit_code"] == 4 and doc["error"]["hint"]


def test_without_json_stdout_stays_empty_on_failure(capsys):
    code, out, err = run_main(["compile", "--preset", "nope", "--dry-run"], capsys)
    assert code == 2 and out == "" and err.startswith("qvl: error: unknown preset")


# --- help that works when pasted -------------------------------------------------------------------------------


def _help(argv: list[str], capsys: Any) -> str:
    code, out, err = run_main([*argv, "--help"], capsys)
    assert code == 0, err
    return out


def _all_commands() -> list[list[str]]:
    """Every command and subcommand the app registers (commands added later are checked too)."""
    import typer.main

    from qwenvl_rbln.cli import app

    out: list[list[str]] = []

    def walk(command: Any, path: list[str]) -> None:
        subs = getattr(command, "commands", None)
        if not subs:
            out.append(path)
            return
        for name, sub in subs.items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return out


@pytest.mark.parametrize("argv", _all_commands(), ids=" ".join)
def test_help_shows_no_bool_type_and_no_doubled_brackets(argv, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out = _help(argv, capsys)
    assert "<bool>" not in out and "[[" not in out
    assert "Usage:" in out


def test_a_flag_given_a_value_points_at_its_own_commands_help(capsys):
    code, _, err = run_main(["compile", "--dry-run=true"], capsys)
    assert code == 2
    assert "--dry-run is a flag" in err and "`qvl compile --help`" in err
    code, _, err = run_main(["presets", "list", "--json=1"], capsys)
    assert code == 2 and "`qvl presets list --help`" in err


# --- defaults never cross projects -----------------------------------------------------------------------------


def test_the_last_compile_is_remembered_per_working_directory(tiny, tmp_path, monkeypatch, capsys):
    """`qvl load-check` in another folder once checked this folder's artifact and said ok."""
    a, b = tmp_path / "project-a", tmp_path / "project-b"
    a.mkdir()
    b.mkdir()
    monkeypatch.chdir(a)
    code, _, err = run_main(["compile", "--preset", "cpu-tiny", "--no-cache"], capsys)
    assert code == 0, err
    code, out, err = run_main(["load-check", "--no-runtime", "--json"], capsys)
    assert code == 0, err
    assert Path(json.loads(out)["artifact_dir"]) == a / "qvl-out" / "cpu-tiny"
    monkeypatch.chdir(b)
    for command in (["load-check", "--no-runtime"], ["infer", "--prompt", "hi"]):
        code, _, err = run_main(command, capsys)
        assert code == 2, err
        assert str(a) not in err and "no artifacts at qvl-out/rebel100-1npu " in err
        assert f"`qvl {command[0]} DIR ...`" in err


def test_load_check_help_states_the_rule_infer_follows(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    out = " ".join(_help(["load-check"], capsys).split())
    assert "as for `qvl infer`" in out and "last `qvl compile` run from this working directory" in out


# --- errors name their origin ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("foo.bar=1", "unknown rbln_config key 'rbln_config.foo'"),
        ("kvcache_partition_len=3000", "must be a multiple of kvcache_partition_len (3000)"),
    ],
)
def test_a_problem_a_set_causes_names_set_not_the_preset_file(value, needle, tmp_path, capsys):
    code, _, err = run_main(["compile", "--dry-run", "--set", value], capsys)
    assert code == 2 and err.startswith("qvl: error: --set: ") and needle in err, err
    assert "rebel100-1npu.yaml" not in err
    own = tmp_path / "mine.yaml"  # the same value written in a preset file is that file's problem
    key, raw = value.split("=")
    own.write_text(f"extends: rebel100-1npu\nrbln_config:\n  {key.replace('.', ': {')}: {raw}{'}' * key.count('.')}\n")
    code, _, err = run_main(["compile", "--dry-run", "--preset", str(own)], capsys)
    assert code == 2 and err.startswith(f"qvl: error: {own}: ") and needle in err, err


# --- infer input errors as good as bucket-plan's ---------------------------------------------------------------


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from PIL import Image

    d = tmp_path_factory.mktemp("images")
    out = {}
    for name, size in (("thin", (1, 300)), ("one", (1, 1)), ("three", (3, 1)), ("ok", (64, 48))):
        out[name] = d / f"{name}.png"
        Image.new("RGB", size, (10, 200, 30)).save(out[name])
    return out


def test_an_impossible_aspect_ratio_is_named_by_its_file(tiny, images, capsys, no_model_load):
    code, _, err = run_main(["infer", str(tiny), "--preset", "cpu-tiny", "--image", str(images["thin"])], capsys)
    assert code == 2
    assert err.startswith(f"qvl: error: {images['thin']}: size 1x300 (WxH) has aspect ratio 300.0"), err


def test_a_batch_file_reports_every_bad_line_at_once(tiny, images, tmp_path, capsys, no_model_load):
    batch = tmp_path / "b.jsonl"
    lines = [
        "{not json",
        json.dumps({"prompt": "x", "imagez": [str(images["ok"])]}),
        json.dumps({"prompt": "x", "images": [str(tmp_path / "missing.png")]}),
        json.dumps({"prompt": "fine", "images": [str(images["ok"])]}),
        json.dumps({"id": "4", "prompt": "same id as the line above"}),
    ]
    batch.write_text("\n".join(lines) + "\n")
    argv = ["infer", str(tiny), "--preset", "cpu-tiny", "--batch-file", str(batch)]
    code, _, err = run_main(argv, capsys)
    assert code == 2
    head, *listed = err.strip().splitlines()
    assert head == f"qvl: error: 4 bad lines in {batch} (each listed below); fix: correct each line listed; nothing ran"
    assert [ln.split(": ")[0].strip() for ln in listed] == [f"{batch}:{n}" for n in (1, 2, 3, 5)]
    assert "did you mean 'image'?" in listed[1] and "missing.png: no such file" in listed[2]
    code, out, _ = run_main([*argv, "--json"], capsys)
    error = json.loads(out)["error"]
    assert code == 2 and error["exit_code"] == 2 and len(error["problems"]) == 4
    # problems found later (geometry) are gathered the same way, one per request
    batch.write_text(
        json.dumps({"images": [str(images["thin"])]}) + "\n" + json.dumps({"images": [str(images["thin"])]})
    )
    code, _, err = run_main(argv, capsys)
    assert code == 2 and f"{batch}:1: {images['thin']}: size 1x300" in err and f"{batch}:2: {images['thin']}" in err


def test_one_and_three_pixel_images_run_without_transformers_channel_warning(tiny, images, capsys):
    """transformers logs "The channel dimension is ambiguous" for them; a handler on that logger sees what
    would reach the user (its own stream handler is bound to the process's stderr, outside capsys)."""
    import logging

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger = logging.getLogger("transformers.image_utils")
    handler = Keep()
    logger.addHandler(handler)
    try:
        argv = ["infer", str(tiny), "--preset", "cpu-tiny", "--max-new-tokens", "1", "--prompt", "hi"]
        code, _, err = run_main([*argv, "--image", str(images["one"]), "--image", str(images["three"])], capsys)
    finally:
        logger.removeHandler(handler)
    assert code == 0, err
    assert not [m for m in seen if "ambiguous" in m] and "ambiguous" not in err


# --- one meaning per field -------------------------------------------------------------------------------------

SHARED_FIELDS = ("width", "height", "resized_width", "resized_height", "patches", "bucket", "padding_pct", "capped")


def test_bucket_plan_and_infer_report_the_same_fields_for_the_same_input(tiny, tmp_path, capsys):
    """1920x1080 under cpu-tiny was capped in bucket-plan and not in infer, and padding was rounded differently."""
    from PIL import Image

    paths = []
    for w, h in ((1920, 1080), (640, 480), (100, 37)):
        paths.append(tmp_path / f"{w}x{h}.png")
        Image.new("RGB", (w, h), (90, 90, 90)).save(paths[-1])
    code, out, err = run_main(["bucket-plan", "--preset", "cpu-tiny", *map(str, paths), "--json"], capsys)
    assert code == 0, err
    planned = {Path(it["input"]).name: it for it in json.loads(out)["items"]}
    argv = ["infer", str(tiny), "--preset", "cpu-tiny", "--prompt", "hi", "--max-new-tokens", "1", "--json"]
    code, out, err = run_main([*argv, *(a for p in paths for a in ("--image", str(p)))], capsys)
    assert code == 0, err
    ran = {Path(it["input"]).name: it for it in json.loads(out)["requests"][0]["vision"]}
    assert planned["1920x1080.png"]["capped"] is True
    for name, item in planned.items():
        assert {k: ran[name][k] for k in SHARED_FIELDS} == {k: item[k] for k in SHARED_FIELDS}, name


# --- small ones ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("w.jsonl", '{"width": 640, "height": 480, "count": 2.0}\n'),
        ("w.jsonl", '{"width": 640, "height": 480, "count": 1e2}\n'),
        ("w.csv", "width,height,count\n640,480,2.0\n"),
        ("w.jsonl", '{"width": 640, "height": 480, "count": 2.5}\n'),  # refused before: still refused
    ],
)
def test_a_float_count_is_refused(name, text, tmp_path, capsys):
    path = tmp_path / name
    path.write_text(text)
    code, _, err = run_main(["bucket-plan", "--workload", str(path)], capsys)
    assert code == 2 and f"{path}:" in err and "count=" in err and "is not an integer >= 0" in err, err


def test_an_integer_count_is_still_read(tmp_path, capsys):
    path = tmp_path / "w.csv"
    path.write_text("width,height,count\n640,480,3\n")
    code, out, err = run_main(["bucket-plan", "--workload", str(path), "--json"], capsys)
    assert code == 0 and json.loads(out)["workload"]["requests"] == 3, err


def test_negative_rows_are_refused(capsys):
    code, _, err = run_main(["bucket-plan", "--size", "100x100", "--rows", "-1"], capsys)
    assert code == 2 and "--rows" in err and "`qvl bucket-plan --help`" in err


def test_one_request_on_one_line_is_said_in_the_singular(tmp_path, capsys):
    path = tmp_path / "w.jsonl"
    path.write_text('{"width": 640, "height": 480}\n')
    code, out, err = run_main(["bucket-plan", "--workload", str(path)], capsys)
    assert code == 0, err
    assert "1 request on 1 line, aggregated into 1 distinct size" in out


# The README and the pages its reference moved to (their examples were the README's).
EXAMPLE_DOCS = ("README.md", "docs/compile.md", "docs/bucket-plan.md", "docs/infer.md", "docs/serving.md")


def _readme_commands() -> list[str]:
    import re

    from tests.helpers_cli import REPO

    text = "\n".join((REPO / name).read_text(encoding="utf-8") for name in EXAMPLE_DOCS)
    lines = [ln for block in re.findall(r"```bash\n(.*?)```", text, re.S) for ln in block.splitlines()]
    return [ln.split("  #")[0].split(" | ")[0].strip() for ln in lines if ln.strip().startswith("qvl ")]


def test_readme_examples_work_when_pasted(capsys):
    """Unquoted brackets glob in bash and fail in zsh; an example image must be one the repo has."""
    import re
    import shlex

    from tests.helpers_cli import REPO

    commands = _readme_commands()
    assert commands
    for cmd in commands:
        assert "[" not in re.sub(r"'[^']*'|\"[^\"]*\"", "", cmd), cmd
        words = shlex.split(cmd)
        for flag in ("--image", "--video"):
            if flag in words and words[1] != "deploy":  # deploy's --image is the serving container's
                assert (REPO / words[words.index(flag) + 1]).is_file(), cmd
        if "--dry-run" in words and words[1] == "compile":
            code, _, err = run_main(words[1:], capsys)
            assert code in (0, 4), (cmd, err)  # 4: the example that shows a configuration that does not fit
    assert not [name for name in EXAMPLE_DOCS if "cat.jpg" in (REPO / name).read_text(encoding="utf-8")]


def test_a_compiled_artifact_in_a_markup_named_directory_is_reported_literally(tiny, odd, capsys):
    out_dir = odd["root"] / "[bold]art[/x]"
    code, out, err = run_main(["compile", "--preset", "cpu-tiny", "--no-cache", "-o", str(out_dir)], capsys)
    assert code == 0, err
    _literal(out, "[bold]art[/x]")
    code, out, err = run_main(["load-check", str(out_dir), "--no-runtime"], capsys)
    assert code == 0, err
    _literal(out, "[bold]proj", "[bold]art[/x]")
    code, out, err = run_main(["infer", str(out_dir), "--prompt", MARKUP, "--max-new-tokens", "2"], capsys)
    assert code == 0, err
    _literal(out, "[bold]art[/x]")


def test_presets_list_and_tiny_model_print_names_literally(tiny, tmp_path, capsys, monkeypatch):
    from qwenvl_rbln.planning import presets

    (tmp_path / "[bold]mine.yaml").write_text(f"extends: rebel100-1npu\ndescription: '{MARKUP}'\n")
    shipped = presets.preset_dirs
    monkeypatch.setattr(presets, "preset_dirs", lambda: [tmp_path, *shipped()])
    code, out, err = run_main(["presets", "list"], capsys)
    assert code == 0, err
    _literal(out, "[bold]mine", MARKUP)
    link = tmp_path / "[bold]tiny[red]"
    link.symlink_to(tiny, target_is_directory=True)  # already built: reused, so this is quick
    code, out, err = run_main(["tiny-model", str(link)], capsys)
    assert code == 0, err
    _literal(out, "[bold]tiny[red]")
