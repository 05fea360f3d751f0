"""Human view of ``qvl deploy``: the files written (or, with --dry-run, their text), the checks serve would print,
the warnings, and what to do next."""

from __future__ import annotations

from typing import Any


def human(console: Any, d: dict[str, Any]) -> None:
    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    if d["dry_run"]:
        for row in d["files"]:
            if row["text"] is None and row["bytes"] is None:
                say(f"# ---- {row['path']} (binary, built when the folder is written: not shown) ----")
                continue
            if row["text"] is None:
                say(f"# ---- {row['path']} ({row['bytes']} bytes, binary: not shown) ----")
                continue
            say(f"# ---- {row['path']} ----")
            say(row["text"].rstrip("\n"))
        say("# ---- (dry run: nothing was written) ----")
    for check in d["checks"]:
        mark = "ok  " if check["ok"] else "warn"
        say(f"# {mark} {check['check']}: {check['detail']}")
    npu = d["npu"]
    say(
        f"qvl deploy: {d['name']} for {d['target']} (Kubernetes {d['kubernetes']}+), {npu['devices_per_replica']} "
        f"NPU(s) per replica ({npu['mode']}{', family ' + npu['family'] if npu['family'] else ''}), image {d['image']}"
    )
    budget = "measured load x 3" if d["load_measured"] else "a stated conservative figure"
    say(f"startup budget {d['startup_budget_s']} s ({budget})")
    if not d["dry_run"]:
        say(f"wrote {d['out']}: " + ", ".join(row["path"] for row in d["files"]))
    for note in d["notes"]:
        say(f"note: {note}")
    say("next:")
    for step in d["next"]:
        say(f"  {step.replace('THIS_FOLDER', d['out'] or 'OUT')}")
