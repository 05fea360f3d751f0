"""`qvl compare A.json B.json`: agreement, first divergence, exit codes 0 / 7 / 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.inference.compare import EXIT_DIVERGED, compare_runs, compare_tokens, load_infer_json
from tests.fakes_rbln import run_main


def _run(
    path: Path,
    backend: str,
    requests: dict[str, list[int]],
    *,
    do_sample: bool = False,
    inputs: dict[str, dict] | None = None,
) -> Path:
    """An `infer --json` document; ``inputs[id]`` adds that request's input fields (prompt, vision, ...)."""
    data = {
        "backend": backend,
        "preset": "cpu-tiny",
        "generation": {"max_new_tokens": 8, "do_sample": do_sample},
        "requests": [
            {"id": rid, "text": f"text {rid}", "token_ids": ids, **(inputs or {}).get(rid, {})}
            for rid, ids in requests.items()
        ],
    }
    path.write_text(json.dumps(data))
    return path


def _vision(name: str, width: int = 640, height: int = 480, patches: int = 1200) -> dict:
    return {
        "input": name,
        "kind": "image",
        "width": width,
        "height": height,
        "resized_width": 640,
        "resized_height": 480,
        "patches": patches,
        "calls": 1,
        "frames": None,
    }


def test_compare_tokens():
    assert compare_tokens([1, 2, 3], [1, 2, 3]) == {
        "tokens_a": 3,
        "tokens_b": 3,
        "compared": 3,
        "equal": 3,
        "agreement_pct": 100.0,
        "identical": True,
        "shared_identical": True,
        "matching_prefix": 3,
        "first_divergence": None,
        "length_difference": None,
    }
    d = compare_tokens([1, 2, 3, 4], [1, 9, 3, 4])
    assert d["first_divergence"] == {"index": 1, "a": 2, "b": 9}
    assert (d["agreement_pct"], d["matching_prefix"], d["identical"]) == (75.0, 1, False)
    assert compare_tokens([], [])["identical"] is True


def test_a_shorter_run_is_compared_on_the_shared_tokens_and_its_length_reported_apart():
    """A run against its own prefix once scored 50 % agreement with a 'divergence' at the end of the shorter."""
    d = compare_tokens([1, 2], [1, 2, 5, 6])
    assert (d["compared"], d["agreement_pct"], d["first_divergence"], d["matching_prefix"]) == (2, 100.0, None, 2)
    assert d["length_difference"] == {"longer": "b", "extra_tokens": 2, "from_index": 2}
    assert (d["identical"], d["shared_identical"]) == (False, True)
    d = compare_tokens([1, 3, 4], [1, 2])
    assert d["first_divergence"] == {"index": 1, "a": 3, "b": 2} and d["agreement_pct"] == 50.0


def test_compare_against_its_own_prefix_exits_0_and_7_only_with_strict_length(tmp_path, capsys):
    full = list(range(100, 164))
    a = _run(tmp_path / "long.json", "torch", {"1": full, "2": [7, 8]})
    b = _run(tmp_path / "short.json", "torch", {"1": full[:10], "2": [7, 8]})
    code, out, err = run_main(["compare", str(a), str(b), "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert "error" not in data
    s = data["summary"]
    assert (s["agreement_pct"], s["tokens_compared"], s["length_differs_requests"], s["diverged_requests"]) == (
        100.0,
        12,
        1,
        0,
    )
    assert data["requests"][0]["length_difference"] == {"longer": "a", "extra_tokens": 54, "from_index": 10}
    code, out, _ = run_main(["compare", str(a), str(b)], capsys)
    assert code == 0 and "100.0 % of 12 shared tokens agree" in out and "A +54 from index 10" in out
    code, out, err = run_main(["compare", str(a), str(b), "--strict-length", "--json"], capsys)
    assert code == 7
    data = json.loads(out)  # one document: the report, with the failure in the shape every command uses
    assert data["summary"]["agreement_pct"] == 100.0
    assert data["error"]["exit_code"] == 7 and "--strict-length" in data["error"]["message"]
    assert "differ in length (--strict-length)" in err


def test_identical_runs_exit_0(tmp_path, capsys):
    a = _run(tmp_path / "a.json", "rbln", {"1": [5, 6, 7], "cat": [1, 2]})
    b = _run(tmp_path / "b.json", "torch", {"cat": [1, 2], "1": [5, 6, 7]})  # order does not matter, ids do
    code, out, err = run_main(["compare", str(a), str(b), "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["summary"] == {
        "requests": 2,
        "identical_requests": 2,
        "diverged_requests": 0,
        "length_differs_requests": 0,
        "missing_requests": 0,
        "inputs_differ_requests": 0,
        "tokens_compared": 5,
        "agreement_pct": 100.0,
        "identical": True,
        "strict_length": False,
    }
    code, out, _ = run_main(["compare", str(a), str(b)], capsys)
    assert code == 0 and "identical: 2/2 requests identical" in out


def test_divergence_exit_7_with_the_first_divergent_tokens(tmp_path, capsys):
    a = _run(tmp_path / "npu.json", "rbln", {"1": [5, 6, 7, 8], "2": [1, 2, 3]})
    b = _run(tmp_path / "ref.json", "torch", {"1": [5, 6, 9, 8], "2": [1, 2, 3], "3": [4]})
    code, out, err = run_main(["compare", str(a), str(b), "--json"], capsys)
    assert code == EXIT_DIVERGED == 7
    data = json.loads(out)  # the report is printed in full before the exit code
    r1, r2, r3 = data["requests"]
    assert r1["first_divergence"] == {"index": 2, "a": 7, "b": 9} and r1["agreement_pct"] == 75.0
    assert r1["text_a"] == "text 1" and r2["identical"] is True
    assert r3 == {"id": "3", "missing_in": "a", "identical": False}
    s = data["summary"]
    assert (s["identical_requests"], s["diverged_requests"], s["missing_requests"]) == (1, 1, 1)
    assert s["tokens_compared"] == 7 and s["agreement_pct"] == round(100 * 6 / 7, 2)
    code, out, _ = run_main(["compare", str(a), str(b)], capsys)
    assert code == 7 and "index 2" in out and "A 7 / B 9" in out and "missing in A" in out and "diverged" in out


def test_notes_for_sampled_runs(tmp_path):
    a = _run(tmp_path / "a.json", "rbln", {"1": [1]}, do_sample=True)
    b = _run(tmp_path / "b.json", "torch", {"1": [1]})
    assert any("sampled" in n for n in compare_runs(a, b)["notes"])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        ("{not json", "not valid JSON"),
        ('{"backend": "torch"}', "no 'requests' list"),
        ('{"requests": [{"id": "1"}]}', "requests[0] has no 'id' or no 'token_ids' list"),
        ('{"requests": [{"id": "1", "token_ids": ["a"]}]}', "something other than integers"),
        ('{"requests": [{"id": 1, "token_ids": []}, {"id": "1", "token_ids": []}]}', "appears twice"),
    ],
)
def test_bad_files_exit_2(tmp_path, capsys, content, message):
    good = _run(tmp_path / "good.json", "torch", {"1": [1]})
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_infer_json(bad)
    code, out, err = run_main(["compare", str(good), str(bad)], capsys)
    assert code == 2 and out == "" and err.startswith("qvl: error: ") and message in err
    assert err.count("\n") == 1


def _inputs(prompt: str = "Describe.", image: str = "/npu-host/cat.jpg", **vision: int) -> dict:
    return {"prompt": prompt, "system": None, "vision": [_vision(image, **vision)], "prefill": {"tokens": 1230}}


@pytest.mark.parametrize(
    ("b_inputs", "field"),
    [
        (_inputs(prompt="What happens?"), "prompt 'Describe.' in A and 'What happens?' in B"),
        (_inputs(image="/ref-host/dog.jpg"), "vision[0].input 'cat.jpg' in A and 'dog.jpg' in B"),
        (_inputs(width=1280), "vision[0].width 640 in A and 1280 in B"),
        (_inputs(patches=1024), "vision[0].patches 1200 in A and 1024 in B"),
        ({**_inputs(), "vision": []}, "vision '1 images/videos' in A and '0 images/videos' in B"),
        ({**_inputs(), "system": "Be brief."}, "system None in A and 'Be brief.' in B"),
        ({**_inputs(), "prefill": {"tokens": 99}}, "prefill.tokens 1230 in A and 99 in B"),
    ],
)
def test_different_inputs_are_refused_naming_request_and_field(tmp_path, capsys, b_inputs, field):
    """Same ids, same tokens, different requests: not 'identical' but exit 2 naming the first difference."""
    a = _run(tmp_path / "a.json", "rbln", {"0": [1], "cat": [5, 6]}, inputs={"0": _inputs(), "cat": _inputs()})
    b = _run(tmp_path / "b.json", "torch", {"0": [1], "cat": [5, 6]}, inputs={"0": _inputs(), "cat": b_inputs})
    code, out, err = run_main(["compare", str(a), str(b), "--json"], capsys)
    assert code == 2 and json.loads(out)["error"]["exit_code"] == 2 and err.count("\n") == 1
    assert err.startswith("qvl: error: ") and f"request 'cat' has {field}" in err and "--ignore-inputs" in err

    code, out, err = run_main(["compare", str(a), str(b), "--json", "--ignore-inputs"], capsys)
    assert code == 0, err  # the tokens agree; the report says the inputs did not
    data = json.loads(out)
    assert data["requests"][1]["inputs_differ"] and data["summary"]["inputs_differ_requests"] == 1
    assert any("ran different inputs" in n for n in data["notes"])


def test_same_inputs_on_different_hosts_compare(tmp_path, capsys):
    """Paths differ between the NPU host and the reference host: the file name, size and patches decide."""
    a = _run(tmp_path / "a.json", "rbln", {"1": [1, 2]}, inputs={"1": _inputs(image="/npu/data/cat.jpg")})
    b = _run(tmp_path / "b.json", "torch", {"1": [1, 2]}, inputs={"1": _inputs(image="/home/me/cat.jpg")})
    code, out, err = run_main(["compare", str(a), str(b), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["summary"]["identical"] is True
