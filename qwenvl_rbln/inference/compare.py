"""Token agreement between two ``qvl infer --json`` outputs (an NPU run against the torch reference).

Per request id present in either file:

* ``compared``: the shared positions, ``min(len(a), len(b))``: the tokens both runs produced;
* ``agreement_pct``: share of those shared positions with the same token id;
* ``first_divergence``: the first shared index where they differ, with both tokens, or ``None`` when the
  shared tokens are equal;
* ``matching_prefix``: tokens equal before the first divergence (greedy decoding makes everything after
  it a consequence, so this is the number that matters);
* ``length_difference``: ``None`` when both runs produced as many tokens, else which one is longer and by
  how many tokens (one run stopping earlier, e.g. a smaller ``max_new_tokens``, is not a divergence);
* ``identical``: same tokens and same length.

Token agreement only means something when both runs saw the same inputs, so a request's inputs are
compared first: ``prompt``, ``system``, each vision input (file name, kind, size, resized size, patches,
ViT calls, frames) and the prompt token count. A difference is refused (InputError, exit 2) naming the
first differing request and field, unless ``ignore_inputs`` (``--ignore-inputs``): then the tokens are
compared anyway and each such request lists ``inputs_differ``. A field missing from either file is not
compared (older outputs).

Exit codes (``qvl compare``): 0 the shared tokens of every request agree (lengths may differ); 7
(``EXIT_DIVERGED``) at least one request's shared tokens differ, a request is missing from one file, or
(``strict_length``, ``--strict-length``) a request's lengths differ; 2 a file is missing, not JSON, or not
``qvl infer --json`` output, or the two runs had different inputs (without ``--ignore-inputs``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import EXIT_DIVERGED, InputError, QvlError
from qwenvl_rbln.paths import user_path


def load_infer_json(path: str | Path) -> dict[str, Any]:
    """A ``qvl infer --json`` document; InputError naming the file otherwise."""
    path = user_path(path)
    fix = "pass the stdout of `qvl infer --json ... > run.json`"
    if not path.is_file():
        raise InputError(f"{path} {'is a directory' if path.is_dir() else 'does not exist'}", fix)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text", fix) from None
    except ValueError as exc:
        raise InputError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})", fix) from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror})", "check the file permissions") from None
    if not isinstance(data, dict) or not isinstance(data.get("requests"), list):
        raise InputError(f"{path}: not qvl infer --json output (no 'requests' list)", fix)
    seen: set[str] = set()
    for n, req in enumerate(data["requests"]):
        if not isinstance(req, dict) or "id" not in req or not isinstance(req.get("token_ids"), list):
            raise InputError(f"{path}: requests[{n}] has no 'id' or no 'token_ids' list", fix)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in req["token_ids"]):
            raise InputError(f"{path}: requests[{n}].token_ids holds something other than integers", fix)
        rid = str(req["id"])
        if rid in seen:
            raise InputError(f"{path}: request id '{rid}' appears twice", fix)
        seen.add(rid)
    return data


def compare_tokens(a: list[int], b: list[int]) -> dict[str, Any]:
    """Agreement over the tokens both sequences have; a length difference is reported on its own."""
    shared = min(len(a), len(b))
    equal = sum(1 for x, y in zip(a, b, strict=False) if x == y)
    first = next((i for i in range(shared) if a[i] != b[i]), None)
    length = None
    if len(a) != len(b):
        length = {"longer": "a" if len(a) > len(b) else "b", "extra_tokens": abs(len(a) - len(b)), "from_index": shared}
    return {
        "tokens_a": len(a),
        "tokens_b": len(b),
        "compared": shared,
        "equal": equal,
        "agreement_pct": 100.0 if shared == 0 else round(100.0 * equal / shared, 2),
        "identical": first is None and length is None,
        "shared_identical": first is None,
        "matching_prefix": shared if first is None else first,
        "first_divergence": None if first is None else {"index": first, "a": a[first], "b": b[first]},
        "length_difference": length,
    }


VISION_FIELDS = ("input", "kind", "width", "height", "resized_width", "resized_height", "patches", "calls", "frames")


def _vision_value(item: Any, key: str) -> Any:
    """A vision input's field; the file by name only (the NPU host and the reference host differ in paths)."""
    value = item.get(key) if isinstance(item, dict) else None
    return Path(value).name if key == "input" and isinstance(value, str) else value


def _vision_differences(va: list[Any], vb: list[Any]) -> list[tuple[str, Any, Any]]:
    if len(va) != len(vb):
        return [("vision", f"{len(va)} images/videos", f"{len(vb)} images/videos")]
    for n, (x, y) in enumerate(zip(va, vb, strict=True)):
        for key in VISION_FIELDS:
            a, b = _vision_value(x, key), _vision_value(y, key)
            if a != b:
                return [(f"vision[{n}].{key}", a, b)]
    return []


def input_differences(ra: dict[str, Any], rb: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field, value in A, value in B) for every input two runs of one request disagree on."""
    out = [(key, ra[key], rb[key]) for key in ("prompt", "system") if key in ra and key in rb and ra[key] != rb[key]]
    va, vb = ra.get("vision"), rb.get("vision")
    if isinstance(va, list) and isinstance(vb, list):
        out += _vision_differences(va, vb)
    pa, pb = (ra.get("prefill") or {}).get("tokens"), (rb.get("prefill") or {}).get("tokens")
    if isinstance(pa, int) and isinstance(pb, int) and pa != pb:
        out.append(("prefill.tokens", pa, pb))
    return out


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _inputs_error(path_a: Any, path_b: Any, rid: str, diff: tuple[str, Any, Any]) -> InputError:
    field, a, b = diff
    return InputError(
        f"{path_a} and {path_b} ran different inputs: request '{rid}' has {field} {_short(a)} in A and "
        f"{_short(b)} in B, so its tokens cannot be compared",
        "compare two runs of the same requests (same --prompt/--image/--video/--batch-file and pixel caps), "
        "or pass --ignore-inputs to compare the tokens anyway",
    )


def _describe(data: dict[str, Any], path: str | Path) -> dict[str, Any]:
    return {
        "path": str(path),
        "backend": data.get("backend"),
        "preset": data.get("preset"),
        "artifact_dir": data.get("artifact_dir"),
        "generation": data.get("generation"),
        "requests": len(data["requests"]),
    }


def compare_runs(
    path_a: str | Path, path_b: str | Path, *, ignore_inputs: bool = False, strict_length: bool = False
) -> dict[str, Any]:
    """The comparison report (see the module docstring); InputError when the inputs differ, unless ignored."""
    a = load_infer_json(path_a)
    b = load_infer_json(path_b)
    by_a = {str(r["id"]): r for r in a["requests"]}
    by_b = {str(r["id"]): r for r in b["requests"]}
    ids = list(by_a) + [i for i in by_b if i not in by_a]
    rows = []
    notes = []
    for rid in ids:
        ra, rb = by_a.get(rid), by_b.get(rid)
        if ra is None or rb is None:
            rows.append({"id": rid, "missing_in": "a" if ra is None else "b", "identical": False})
            continue
        diffs = input_differences(ra, rb)
        if diffs and not ignore_inputs:
            raise _inputs_error(path_a, path_b, rid, diffs[0])
        row = {"id": rid, **compare_tokens(ra["token_ids"], rb["token_ids"])}
        if diffs:
            row["inputs_differ"] = [field for field, _, _ in diffs]
        if not row["identical"]:
            row["text_a"], row["text_b"] = ra.get("text"), rb.get("text")
        rows.append(row)
    differ = [r["id"] for r in rows if r.get("inputs_differ")]
    if differ:
        notes.append(
            f"{len(differ)} request(s) ran different inputs in A and B ({', '.join(differ[:5])}"
            f"{' ...' if len(differ) > 5 else ''}): their token agreement says nothing (--ignore-inputs)"
        )
    ga, gb = a.get("generation") or {}, b.get("generation") or {}
    if ga.get("do_sample") or gb.get("do_sample"):
        notes.append("at least one run sampled (--temperature): token agreement is only meaningful for greedy runs")
    if ga.get("max_new_tokens") != gb.get("max_new_tokens"):
        notes.append(f"max_new_tokens differs ({ga.get('max_new_tokens')} vs {gb.get('max_new_tokens')})")
    common = [r for r in rows if "missing_in" not in r]
    total = sum(r["compared"] for r in common)
    equal = sum(r["equal"] for r in common)
    diverged = [r for r in common if not r["shared_identical"]]
    lengths = [r for r in common if r["length_difference"] is not None]
    missing = len(rows) - len(common)
    if lengths and not strict_length and not diverged:
        notes.append(
            f"{len(lengths)} request(s) differ only in length (one run stopped earlier): not a divergence; "
            "--strict-length makes it one (exit 7)"
        )
    failed = bool(diverged or missing or (strict_length and lengths))
    return {
        "a": _describe(a, path_a),
        "b": _describe(b, path_b),
        "requests": rows,
        "summary": {
            "requests": len(rows),
            "identical_requests": sum(1 for r in rows if r["identical"]),
            "diverged_requests": len(diverged),
            "length_differs_requests": len(lengths),
            "missing_requests": missing,
            "inputs_differ_requests": len(differ),
            "tokens_compared": total,
            "agreement_pct": 100.0 if total == 0 else round(100.0 * equal / total, 2),
            "identical": all(r["identical"] for r in rows),
            "strict_length": strict_length,
        },
        "exit_code": EXIT_DIVERGED if failed else 0,
        "notes": notes,
    }


def divergence_error(report: dict[str, Any]) -> QvlError | None:
    """The exit-7 failure of a report (None when it passes), naming the first request that fails and why."""
    if not report["exit_code"]:
        return None
    s = report["summary"]
    parts = []
    if s["diverged_requests"]:
        first = next(r for r in report["requests"] if "missing_in" not in r and not r["shared_identical"])
        parts.append(
            f"{s['diverged_requests']} request(s) diverge (first: '{first['id']}' at token "
            f"{first['first_divergence']['index']})"
        )
    if s["missing_requests"]:
        first = next(r for r in report["requests"] if "missing_in" in r)
        parts.append(f"{s['missing_requests']} request(s) missing from one run (first: '{first['id']}')")
    if s["strict_length"] and s["length_differs_requests"]:
        parts.append(f"{s['length_differs_requests']} request(s) differ in length (--strict-length)")
    return QvlError(
        f"{report['a']['path']} and {report['b']['path']}: " + "; ".join(parts),
        "the report above lists each request (text_a/text_b in --json); a divergence after a long matching "
        "prefix is usually numerics, an early one a different model, preset or processor",
        exit_code=EXIT_DIVERGED,
    )
