"""Property (issue 37, item 2): whatever a batch file's lines hold (valid and invalid JSON, lone surrogates, numbers
past Python's digit limit, deep nesting, a byte-order mark, CR, NUL, very long ids, bytes that are not UTF-8), the
batch-file readers and the job's pre-pass accept each line or refuse it with a cause naming ``file:line``, and the
job (through the real CLI edge, a stand-in executor, no Ray, no model) never ends in ``internal error``, never
writes a control character to the terminal, and writes each accepted id exactly once."""

from __future__ import annotations

import json
import tempfile
import unicodedata
from pathlib import Path

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from qwenvl_rbln.batch import driver, results, source
from qwenvl_rbln.batch.records import BAD_REQUEST, error_dict, error_record
from qwenvl_rbln.errors import InputError, InputErrors
from qwenvl_rbln.inference import requests as rq
from tests.fakes_rbln import run_main
from tests.test_batch_core import _ok

ODD = ["\ud800", "\udfff", "\x00", "\r", "\n", "\x1b", "\x9b", "\u2028", "\ufeff", "\u202e", "\x7f", '"', "\\", "#"]
text = st.text(st.one_of(st.characters(), st.sampled_from(ODD)), max_size=12)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10**60), st.floats(allow_nan=True), text
)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3), max_leaves=6
)
ids = st.one_of(
    text,
    st.integers(min_value=-(10**30), max_value=10**30),
    scalars,
    st.builds(lambda n: "i" * n, st.integers(0, 20000)),
)
good_ids = st.one_of(
    st.text(st.one_of(st.characters(), st.sampled_from(ODD[2:])), min_size=1, max_size=12), st.integers()
)
values = {
    "prompt": st.one_of(text, json_values),
    "images": st.one_of(st.lists(text, max_size=2), json_values),
    "video": json_values,
    "system": json_values,
    "extra": json_values,
}
good_requests = st.fixed_dictionaries({}, optional={"id": good_ids, **values})  # the pre-pass takes each
requests = st.fixed_dictionaries(
    {},
    optional={"id": ids, **values},
)


def _dump(value: object, ascii_only: bool) -> str:
    try:
        return json.dumps(value, ensure_ascii=ascii_only, allow_nan=True)
    except (ValueError, RecursionError):
        return "{}"


good_line = st.builds(_dump, good_requests, st.booleans())
line_texts = st.one_of(
    good_line,
    good_line,
    good_line,
    good_line,  # most lines a request with a good id (values of every kind: the worker's bad-request lines)
    st.builds(_dump, requests, st.booleans()),  # a request with any id
    st.builds(_dump, json_values, st.booleans()),  # any JSON value
    text,  # junk, a comment, blank
    st.builds(lambda k: '{"id": "n", "p": ' + "9" * k + "}", st.integers(4200, 4400)),  # around the digit limit
    st.builds(lambda d: "[" * d + "]" * d, st.sampled_from([5, 999, 1001, 100000])),  # deep nesting
)
endings = st.sampled_from(["\n", "\r\n", "\r\r\n"])
lines = st.lists(st.tuples(line_texts, endings, st.booleans()), min_size=1, max_size=6)


def _file(parts: list[tuple[str, str, bool]], bom: bool, cut_last: bool) -> bytes:
    out = b"\xef\xbb\xbf" if bom else b""
    for n, (body, end, latin1) in enumerate(parts):
        raw = body.encode("utf-8", "surrogatepass")  # a raw lone surrogate: bytes that are not UTF-8
        if latin1 and n == len(parts) - 1:
            raw = body.encode("latin-1", "replace")
        out += raw + (b"" if cut_last and n == len(parts) - 1 else end.encode())
    return out


def _no_control(err: str) -> bool:
    return not any(unicodedata.category(ch) == "Cc" for ch in err.replace("\n", ""))


class Checking:
    """The executor's view of each line: ``requests.from_object`` must give a request or an InputError (a
    ``bad-request`` line quoting the value, surrogates and all), never another exception."""

    def run(self, items, emit, event) -> None:
        for item in items:
            try:
                rq.from_object(f"b.jsonl:{item.line}", item.raw, Path("/nonexistent"), item.id)
            except InputError as exc:
                emit(error_record(item, error_dict(BAD_REQUEST, exc.one_line() + repr(item.raw)[:100])))
            else:
                emit(_ok(item))

    def close(self) -> None:
        pass


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=lines, bom=st.booleans(), cut_last=st.booleans())
@example(parts=[('{"id":"b\\ud800","prompt":"x"}', "\n", False)], bom=False, cut_last=False)
@example(
    parts=[('{"id":"a\\u001b[31mRED"}', "\n", False), ('{"id":"a\\u001b[31mRED"}', "\n", False)],
    bom=True,
    cut_last=True,
)
@example(parts=[('{"id":"a",\r"prompt":"x"}', "\r\n", False), ('{"id": null}', "\n", False)], bom=True, cut_last=False)
def test_every_line_is_accepted_or_refused_with_a_cause_and_the_job_never_crashes(
    parts, bom, cut_last, capsys, monkeypatch
):
    with tempfile.TemporaryDirectory() as tmp:
        batch, out = Path(tmp) / "b.jsonl", Path(tmp) / "r.jsonl"
        batch.write_bytes(_file(parts, bom, cut_last))
        try:
            check = source.check_unique_ids(batch)
        except InputError as exc:
            check = None
            problems = exc.problems if isinstance(exc, InputErrors) else [exc]
            assert all(p.message.startswith(f"{batch}:") or "has no requests" in p.message for p in problems)
        event("accepted by the pre-pass" if check is not None else "refused by the pre-pass")
        try:
            in_memory = {r.source: r.id for r in rq.parse_batch_file(batch, problems=[])}
        except InputError:
            in_memory = {}
        if check is not None:  # accepted: the job's ids are those of the in-memory reader, each once
            items = list(source.iter_items(batch))
            assert len(items) == check.count == len({i.id for i in items})
            assert all({f"{batch}:{i.line}": i.id for i in items}[where] == rid for where, rid in in_memory.items())

        monkeypatch.setattr(driver, "_target_check", lambda spec: (1, tmp))
        monkeypatch.setattr(driver, "make_executor", lambda opts, n: Checking())
        argv = ["infer", tmp, "--batch-file", str(batch), "--output", str(out), "--json"]
        code, stdout, err = run_main(argv, capsys)
        assert code == (0 if check is not None else 2), err
        assert "internal error" not in err and "Traceback" not in err and _no_control(err), err
        json.loads(stdout)  # one document, success or error
        if check is None:
            assert not out.exists()
            return
        written = [json.loads(x)["id"] for x in out.read_bytes().splitlines()]
        assert sorted(written) == sorted(i.id for i in items)  # each id exactly once
        code, stdout, err = run_main([*argv, "--resume"], capsys)
        assert code == 0 and json.loads(stdout)["counts"]["skipped_by_resume"] == check.count, err
        assert len(results.completed_ids(out)) == check.count
