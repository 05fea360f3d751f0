"""workload.py: JSONL / CSV workloads and batch traces, streamed, with file:line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.vision.workload import read_batch_trace, read_workload


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def _error(fn, path: Path) -> InputError:
    with pytest.raises(InputError) as e:
        fn(path)
    assert e.value.hint
    assert "\n" not in e.value.one_line()
    return e.value


# --- JSONL ----------------------------------------------------------------------------------------


def test_jsonl_images_and_videos(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        "w.jsonl",
        '{"width": 1920, "height": 1080, "count": 3}\n'
        "\n"
        "# a comment\n"
        '{"width": 1920, "height": 1080}\n'
        '{"width": 640, "height": 480, "count": 0}\n'
        '{"width": 1280, "height": 720, "frames": 300, "fps": 30, "count": 2, "request_id": "r1", "ts": 5}\n'
        '{"width": 1280, "height": 720, "frames": 300, "kind": "video"}\n'
        '{"width": 800.0, "height": 600}\n',
    )
    wl = read_workload(p)
    assert wl.format == "jsonl"
    assert wl.sizes == {
        (1920, 1080, None, None): 4,
        (1280, 720, 300, 30.0): 2,
        (1280, 720, 300, None): 1,
        (800, 600, None, None): 1,
    }
    assert wl.lines == 6 and wl.requests == 8 and wl.distinct == 4


def test_jsonl_repeated_lines_use_the_fast_path(tmp_path: Path) -> None:
    lines = ['{"width": 1024, "height": 768}\n'] * 50_000 + ['{"width": 10, "height": 20, "count": 5}\n'] * 10
    p = _write(tmp_path, "big.jsonl", "".join(lines))
    wl = read_workload(p)
    assert wl.sizes == {(1024, 768, None, None): 50_000, (10, 20, None, None): 50}
    assert wl.lines == 50_010


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ('{"width": 0, "height": 10}', "width=0"),
        ('{"width": -5, "height": 10}', "width=-5"),
        ('{"width": "big", "height": 10}', "width='big'"),
        ('{"width": "640", "height": 10}', "width='640' is a string, not a number"),
        ('{"width": 64, "height": 10, "count": "3"}', "count='3' is a string"),
        ('{"width": 64, "height": 10, "frames": 9, "fps": "30"}', "fps='30' is a string"),
        ('{"Width": 64, "height": 10}', "unknown key 'Width'"),
        ('{"width": 10.5, "height": 10}', "width=10.5"),
        ('{"width": true, "height": 10}', "width=True"),
        ('{"height": 10}', "missing 'width'"),
        ('{"widht": 10, "height": 10}', "'widht'"),
        ('{"width": 10, "height": 10, "count": -1}', "count=-1"),
        ('{"width": 10, "height": 10, "frames": 0}', "frames=0"),
        ('{"width": 10, "height": 10, "frames": 9, "fps": "fast"}', "fps='fast'"),
        ('{"width": 10, "height": 10, "fps": 30}', "without frames"),
        ('{"width": 10, "height": 10, "kind": "video"}', "needs 'frames'"),
        ('{"width": 10, "height": 10, "kind": "audio"}', "kind='audio'"),
        ("[1, 2]", "expected a JSON object"),
        ('{"width": 10, "height": ', "not valid JSON"),
    ],
)
def test_jsonl_errors_name_file_line_and_value(tmp_path: Path, line: str, needle: str) -> None:
    p = _write(tmp_path, "w.jsonl", '{"width": 64, "height": 64}\n' + line + "\n")
    e = _error(read_workload, p)
    assert f"{p}:2" in e.message
    assert needle in e.message


def test_json_array_and_sniffing(tmp_path: Path) -> None:
    p = _write(tmp_path, "w.json", json.dumps([{"width": 64, "height": 32, "count": 2}, {"width": 64, "height": 32}]))
    assert read_workload(p).sizes == {(64, 32, None, None): 3}
    bad = _write(tmp_path, "b.json", json.dumps([{"width": 64, "height": 32}, 5]))
    assert "item 1" in _error(read_workload, bad).message
    sniffed = _write(tmp_path, "log.txt", '{"width": 64, "height": 32}\n')
    assert read_workload(sniffed).format == "jsonl"
    sniffed_csv = _write(tmp_path, "log.dat", "width,height\n64,32\n")
    assert read_workload(sniffed_csv).format == "csv"


# --- CSV ------------------------------------------------------------------------------------------


def test_csv(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        "w.csv",
        "\ufeffWidth, Height ,count,frames,fps\n1920,1080,10,,\n\n1920,1080,5,,\n1280,720,2,300,29.97\n640,480,,,\n",
    )
    wl = read_workload(p)
    assert wl.format == "csv"
    assert wl.sizes == {(1920, 1080, None, None): 15, (1280, 720, 300, 29.97): 2, (640, 480, None, None): 1}


def test_csv_minimal_header_and_extra_columns(tmp_path: Path) -> None:
    p = _write(tmp_path, "w.csv", "width,height,source\n100,200,cam1\n100,200,cam2\n")
    wl = read_workload(p)
    assert wl.sizes == {(100, 200, None, None): 2} and wl.ignored == {"source"}


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("w.csv", "width,height,source\n100,200,cam1\n"),
        ("w.jsonl", '{"width": 100, "height": 200, "source": "cam1"}\n'),
        ("w.json", '[{"width": 100, "height": 200, "source": "cam1"}]'),
    ],
)
def test_extra_keys_are_ignored_and_listed_alike_in_every_format(tmp_path: Path, name: str, text: str) -> None:
    """Logs carry ids and timestamps: every format reads past them the same way and lists them once."""
    wl = read_workload(_write(tmp_path, name, text))
    assert wl.sizes == {(100, 200, None, None): 1} and wl.ignored == {"source"}


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("w.csv", "widht,height\n100,200\n", ":1: unknown column 'widht'"),
        ("w.jsonl", '{"widht": 100, "height": 200}\n', ":1: unknown key 'widht'"),
        ("w.json", '[{"width": 100, "height": 200, "cout": 3}]', "item 0: unknown key 'cout'"),
    ],
)
def test_misspelt_keys_are_errors_in_every_format(tmp_path: Path, name: str, text: str, needle: str) -> None:
    p = _write(tmp_path, name, text)
    e = _error(read_workload, p)
    assert str(p) in e.message and needle in e.message and "did you mean" in (e.hint or "")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("width,count\n1,2\n", "no height column"),
        ("widht,height\n1,2\n", "'widht'"),
        ("width,height,width\n1,2,3\n", "repeats a column"),
        ("1920,1080\n", "'1920'"),
        ("width,height\n1920\n", "1 fields but the header has 2"),
        ("width,height\n1920,abc\n", "height='abc'"),
        ("width,height,count\n1920,1080,-3\n", "count='-3'"),
    ],
)
def test_csv_errors(tmp_path: Path, text: str, needle: str) -> None:
    p = _write(tmp_path, "w.csv", text)
    e = _error(read_workload, p)
    assert str(p) in e.message and needle in e.message


def test_csv_error_line_number(tmp_path: Path) -> None:
    p = _write(tmp_path, "w.csv", "width,height\n10,10\n20,20\n30,x\n")
    assert f"{p}:4" in _error(read_workload, p).message


def test_workload_file_problems(tmp_path: Path) -> None:
    assert "no such" in _error(read_workload, tmp_path / "nope.jsonl").message
    assert "directory" in _error(read_workload, tmp_path).message
    assert "no entries" in _error(read_workload, _write(tmp_path, "e.jsonl", "\n\n")).message
    assert "empty" in _error(read_workload, _write(tmp_path, "e.csv", "")).message
    zero = _write(tmp_path, "z.jsonl", '{"width": 10, "height": 10, "count": 0}\n')
    assert "no entries" in _error(read_workload, zero).message
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"width,height\n\xff\xfe\x00\x81\n")
    assert "UTF-8" in _error(read_workload, binary).message


# --- batch traces ---------------------------------------------------------------------------------


def test_batch_trace_json_and_lines(tmp_path: Path) -> None:
    assert read_batch_trace(_write(tmp_path, "t.json", "[4, 4, 3, 1]")) == {4: 2, 3: 1, 1: 1}
    lines = _write(tmp_path, "t.txt", "# running batch per step\n4\n\n3  # after a finish\n4\n")
    assert read_batch_trace(lines) == {4: 2, 3: 1}


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("t.json", "[4, 0, 3]", "item 1"),
        ("t.json", "[4, 2.5]", "2.5"),
        ("t.json", '{"a": 1}', "JSON list"),
        ("t.json", "[4, ", "not valid JSON"),
        ("t.txt", "4\n3\nfour\n", ":3"),
        ("t.txt", "4\n-1\n", "-1"),
        ("t.txt", "# nothing\n\n", "empty"),
    ],
)
def test_batch_trace_errors(tmp_path: Path, name: str, text: str, needle: str) -> None:
    p = _write(tmp_path, name, text)
    e = _error(read_batch_trace, p)
    assert str(p) in e.message and needle in e.message
    assert "missing" not in e.message


def test_batch_trace_missing(tmp_path: Path) -> None:
    assert "no such" in _error(read_batch_trace, tmp_path / "t.json").message
