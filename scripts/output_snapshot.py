"""Capture every command's human and --json output (175 runs), to prove a refactor changes no byte a user sees.

    git worktree add --detach /tmp/qvl-old <old commit>                       # the code before the change
    PYTHONPATH=/tmp/qvl-old .venv/bin/python scripts/output_snapshot.py capture /tmp/snap-before
    .venv/bin/python scripts/output_snapshot.py capture /tmp/snap-after       # the code in this checkout
    .venv/bin/python scripts/output_snapshot.py diff /tmp/snap-before /tmp/snap-after

Each run records stdout, stderr and the exit code. Both captures use one fixed workspace path, so the paths
printed are the same; what legitimately changes from run to run (seconds, dates, hashes, pids, RSS, token
rates) is masked before writing. Fake 2B artifacts (the real optimum-rbln 0.12 layout, no NPU) come from
``tests/fakes_rbln.py``; the tiny model, the reference compile and the emulated compile are made by the code
under test itself, so their output is compared too.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKSPACE = Path("/tmp/qvl-output-snapshot")
IMAGE = str(ROOT / "assets" / "demo.jpg")
REBEL_PRESETS = ["rebel100-1npu", "rebel100-1npu-batch4", "rebel100-1npu-vit-buckets", "rebel100-2npu-batch4"]
ALL_PRESETS = ["cpu-tiny", "cpu-tiny-rbln", *REBEL_PRESETS]

MASKS = [
    (re.compile(r"\b[0-9a-f]{64}\b"), "<sha256>"),
    (re.compile(r"\b[0-9a-f]{12,40}\b"), "<hex>"),
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+"), "<logtime>"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:?\d\d)?"), "<date>"),
    (
        re.compile(
            r"(\"(?:[a-z_]*_s|seconds|[a-z_]*_ms|[a-z_]*per_s[a-z_]*|peak_rss[a-z_]*|pid|rss[a-z_]*)\": )"
            r"-?[0-9.e+-]+"
        ),
        r"\1<n>",
    ),
    (re.compile(r"-?\d+(\.\d+)?\s?(ms|s|tok/s|tokens/s|it/s)\b"), "<t>"),
    (re.compile(r"\bpid \d+"), "pid <n>"),
    (re.compile(r"\[\d\d:\d\d(<[\d:?]+)?"), "[<clock>"),
    (re.compile(r"\d+(\.\d+)? ?(MiB|GiB|MB|GB) (peak )?RSS"), "<rss>"),
    (re.compile(r"(peak RSS|RSS)[: ]+\d+(\.\d+)? ?(MiB|GiB|MB|GB)"), r"\1 <rss>"),
    (re.compile(r"/tmp/tmp[\w-]+"), "/tmp/<tmp>"),
    (re.compile(r"\.qvl-tmp-[\w.-]+"), ".qvl-tmp-<x>"),
]


def _code_roots() -> list[str]:
    """The checkout under test (first PYTHONPATH entry, e.g. a worktree of the old commit) and this one."""
    first = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]
    return sorted({str(ROOT), *([str(Path(first).resolve())] if first else [])}, key=len, reverse=True)


def mask(text: str) -> str:
    for root in _code_roots():
        text = text.replace(root, "<repo>")
    for pattern, repl in MASKS:
        text = pattern.sub(repl, text)
    return text


def write_fixtures(ws: Path) -> None:
    """Fake 2B artifacts per rebel100 preset, a short video, workloads and batch files."""
    sys.path.insert(0, str(ROOT))  # inputs, so always this checkout's code, even when PYTHONPATH names an old one
    fakes = importlib.import_module("tests.fakes_rbln")
    plan_mod = importlib.import_module("qwenvl_rbln.planning.plan")
    manifest = importlib.import_module("qwenvl_rbln.artifacts.manifest")
    for preset in REBEL_PRESETS:
        plan = plan_mod.build_plan(preset)
        root = fakes.write_artifact(ws / "fake" / preset, plan)
        data = {"format": 1, "npu": plan.npu, "placement": plan.placement, "rbln_config": plan.rbln_config}
        manifest.write_manifest(root, data)
    fakes.write_sweep_video(ws / "clip.mp4", frames=20, fps=8)
    (ws / "sizes.jsonl").write_text(
        "\n".join(
            json.dumps(x)
            for x in (
                {"width": 1920, "height": 1080, "count": 40},
                {"width": 640, "height": 480, "count": 100},
                {"width": 3840, "height": 2160, "count": 3},
                {"width": 320, "height": 240, "images": 8},
                {"width": 1280, "height": 720, "frames": 9000, "fps": 30},
            )
        )
        + "\n"
    )
    from PIL import Image

    Image.new("RGB", (4000, 3000), (90, 120, 150)).save(ws / "big.jpg", quality=80)
    (ws / "sizes.csv").write_text("width,height,count\n1920,1080,10\n800,600,30\n224,224,5\n")
    (ws / "trace.txt").write_text("1\n3\n4\n2\n4\n1\n")
    (ws / "bad.jsonl").write_text('{"width": 10}\nnot json\n')
    (ws / "batch.jsonl").write_text(
        json.dumps({"prompt": "one", "images": [IMAGE]}) + "\n" + json.dumps({"prompt": "two"}) + "\n"
    )


PER_PRESET = [  # (name suffix, arguments) for every shipped preset
    ("show-{p}", "presets show {p}"),
    ("show-{p}-json", "presets show {p} --json"),
    ("dry-{p}", "compile --preset {p} --dry-run"),
    ("dry-{p}-json", "compile --preset {p} --dry-run --json"),
    ("dry-{p}-64g", "compile --preset {p} --dry-run --device-memory 64GiB"),
    ("bp-{p}-size", "bucket-plan --preset {p} --size 1920x1080 --size 640x480"),
    ("bp-{p}-size-json", "bucket-plan --preset {p} --size 1920x1080 --json"),
    ("bp-{p}-workload", "bucket-plan --preset {p} --workload {ws}/sizes.jsonl"),
]
PER_FAKE_ARTIFACT = [  # for the fake 2B artifact of every rebel100 preset
    ("lc-fake-{p}", "load-check {d} --no-runtime"),
    ("lc-fake-{p}-json", "load-check {d} --no-runtime --json"),
    ("lc-fake-{p}-runtime", "load-check {d}"),
    ("lc-fake-{p}-dev", "load-check {d} --no-runtime --device 1 --device-memory 32GiB"),
    ("serve-fake-{p}", "serve {d} --dry-run"),
    ("serve-fake-{p}-json", "serve {d} --dry-run --json --device 2"),
    ("bench-fake-{p}", "bench-serve {d} --dry-run --num-prompts 10"),
    ("infer-fake-{p}", "infer {d} --image {image} --prompt x --max-new-tokens 2"),
]
SETUP = [  # they build what the later runs read
    ("tiny-model", "tiny-model {ws}/tiny"),
    ("tiny-model-reuse", "tiny-model {ws}/tiny --json"),
    ("compile-ref", "compile --preset cpu-tiny --model {ws}/tiny -o {ws}/ref"),
    ("compile-ref-exists", "compile --preset cpu-tiny --model {ws}/tiny -o {ws}/ref --json"),
    ("compile-emu", "compile --preset cpu-tiny-rbln --emulate --model {ws}/tiny -o {ws}/emu"),
    ("help", "--help"),
    ("presets-list", "presets list"),
    ("presets-list-json", "presets list --json"),
    ("presets-show-missing", "presets show nope"),
]
SINGLE = [
    ("dry-b4-262k", "compile --preset rebel100-1npu-batch4 --set max_seq_len=262144 --dry-run"),
    ("dry-b4-262k-json", "compile --preset rebel100-1npu-batch4 --set max_seq_len=262144 --dry-run --json"),
    ("dry-b4-180k", "compile --preset rebel100-1npu-batch4 --set max_seq_len=180224 --dry-run"),
    (
        "dry-b4-180k-ok",
        "compile --preset rebel100-1npu-batch4 --set max_seq_len=180224 --dry-run --uncertain-ok --json",
    ),
    ("dry-vit-set", "compile --preset rebel100-1npu --set visual.max_seq_len=[1024,16384] --dry-run --json"),
    ("dry-bad-key", "compile --preset rebel100-1npu --set nope=1 --dry-run"),
    ("dry-bad-key-json", "compile --preset rebel100-1npu --set nope=1 --dry-run --json"),
    ("dry-bad-value", "compile --preset rebel100-1npu --set batch_size=-3 --dry-run"),
    ("dry-bad-preset", "compile --preset nope --dry-run"),
    ("dry-8b-refused", "compile --preset rebel100-1npu --model Qwen/Qwen3-VL-8B-Instruct --dry-run"),
    ("dry-tiny-model", "compile --preset cpu-tiny-rbln --model {ws}/tiny --dry-run"),
    ("bp-image", "bucket-plan --preset rebel100-1npu-vit-buckets {image} --size 1920x1080"),
    ("bp-video", "bucket-plan --preset rebel100-1npu-vit-buckets {ws}/clip.mp4"),
    ("bp-video-json", "bucket-plan --preset rebel100-1npu {ws}/clip.mp4 {image} --json"),
    ("bp-csv", "bucket-plan --preset rebel100-1npu --workload {ws}/sizes.csv"),
    ("bp-optimize", "bucket-plan --preset rebel100-1npu --workload {ws}/sizes.jsonl --optimize 3"),
    ("bp-optimize-json", "bucket-plan --preset rebel100-1npu --workload {ws}/sizes.jsonl --optimize 2 --json"),
    (
        "bp-optimize-nopack",
        "bucket-plan --preset rebel100-1npu --workload {ws}/sizes.jsonl --optimize 3 --no-vit-packing",
    ),
    ("tune", "tune --workload {ws}/sizes.jsonl --batch-trace {ws}/trace.txt --context 32768 --min-batch 4"),
    ("tune-unmet-json", "tune --workload {ws}/sizes.jsonl --context 262144 --min-batch 64 --json"),
    ("bp-max-bucket", "bucket-plan --preset rebel100-1npu --workload {ws}/sizes.jsonl --optimize 3 --max-bucket 8192"),
    ("bp-decoder", "bucket-plan --preset rebel100-1npu-batch4 --batch-trace {ws}/trace.txt --optimize-decoder 2"),
    (
        "bp-decoder-json",
        "bucket-plan --preset rebel100-1npu-batch4 --batch-trace {ws}/trace.txt --optimize-decoder 2 --json",
    ),
    ("bp-decoder-over", "bucket-plan --preset rebel100-1npu --batch-trace {ws}/trace.txt --json"),
    ("bp-rows", "bucket-plan --preset rebel100-1npu --workload {ws}/sizes.jsonl --rows 2"),
    ("bp-nopack-json", "bucket-plan --preset rebel100-1npu --workload {ws}/sizes.jsonl --no-vit-packing --json"),
    ("bp-missing-file", "bucket-plan --preset rebel100-1npu {ws}/missing.jpg"),
    ("bp-missing-file-json", "bucket-plan --preset rebel100-1npu {ws}/missing.jpg --json"),
    ("bp-bad-workload", "bucket-plan --preset rebel100-1npu --workload {ws}/bad.jsonl"),
    ("bp-bad-size", "bucket-plan --preset rebel100-1npu --size 19x"),
    ("bp-nofit", "bucket-plan --preset rebel100-1npu-batch4 --set max_seq_len=262144 --size 1920x1080 --json"),
    ("bp-dry-run", "bucket-plan --preset rebel100-1npu --size 1920x1080 --dry-run"),
    ("lc-ref", "load-check {ws}/ref"),
    ("lc-ref-json", "load-check {ws}/ref --json"),
    ("lc-ref-noruntime", "load-check {ws}/ref --no-runtime --device-memory 1MiB"),
    ("lc-emu", "load-check {ws}/emu --emulate"),
    ("lc-emu-json", "load-check {ws}/emu --emulate --json"),
    ("lc-emu-noemulate", "load-check {ws}/emu --no-runtime"),
    ("lc-default", "load-check --no-runtime"),
    ("lc-missing", "load-check {ws}/missing-dir"),
    ("serve-ref", "serve {ws}/ref --dry-run"),
    ("serve-emu", "serve {ws}/emu --dry-run --json"),
    ("infer-ref-2img", "infer {ws}/ref --image {image} --image {image} --prompt Compare. --max-new-tokens 6"),
    ("infer-ref-json", "infer {ws}/ref --image {image} --prompt Describe. --max-new-tokens 6 --json"),
    ("infer-ref-video", "infer {ws}/ref --video {ws}/clip.mp4 --prompt What? --max-new-tokens 4 --json"),
    ("infer-ref-text", "infer {ws}/ref --prompt Hello --max-new-tokens 4"),
    ("infer-ref-batch", "infer {ws}/ref --batch-file {ws}/batch.jsonl --max-new-tokens 3"),
    ("infer-ref-disagree", "infer {ws}/ref --set batch_size=4 --prompt x --max-new-tokens 2"),
    ("infer-ref-missing-image", "infer {ws}/ref --image {ws}/missing.jpg --prompt x"),
    ("infer-emu", "infer {ws}/emu --emulate --image {image} --image {image} --prompt Compare. --max-new-tokens 6"),
    ("infer-emu-json", "infer {ws}/emu --emulate --image {image} --prompt Describe. --max-new-tokens 6 --json"),
    (
        "infer-emu-nopack",
        "infer {ws}/emu --emulate --no-vit-packing --image {image} --image {image} --prompt Compare. "
        "--max-new-tokens 4",
    ),
    ("infer-emu-no-emulate", "infer {ws}/emu --image {image} --prompt x --max-new-tokens 2"),
    ("infer-ref-big-resize", "infer {ws}/ref --image {ws}/big.jpg --prompt x --max-new-tokens 2"),
    ("infer-ref-big-error", "infer {ws}/ref --image {ws}/big.jpg --on-oversize error --prompt x --max-new-tokens 2"),
    (
        "infer-ref-sampling",
        "infer {ws}/ref --image {image} --system 'Be brief.' --prompt Say. --temperature 0.7 "
        "--top-p 0.9 --seed 3 --max-new-tokens 4",
    ),
    ("infer-ref-too-long", "infer {ws}/ref --prompt x --max-new-tokens 300000"),
    ("infer-ref-preset", "infer --preset cpu-tiny --prompt x --max-new-tokens 2 --json"),
    (
        "infer-emu-device",
        "infer {ws}/emu --emulate --device 0 --visual-device 0 --video {ws}/clip.mp4 --prompt What? --max-new-tokens 3",
    ),
    (
        "infer-emu-set-disagree",
        "infer {ws}/emu --emulate --set visual.max_seq_len=[256,4096] --prompt x --max-new-tokens 2",
    ),
    ("bp-big-image", "bucket-plan --preset cpu-tiny {ws}/big.jpg --json"),
    ("bp-tiny-model", "bucket-plan --preset cpu-tiny-rbln --model {ws}/tiny --size 1280x720"),
    (
        "bp-set-buckets",
        "bucket-plan --preset rebel100-1npu --set visual.max_seq_len=[256,1024] --workload {ws}/sizes.jsonl",
    ),
    ("show-set", "presets show rebel100-1npu --set batch_size=2 --json"),
    ("show-set-bad", "presets show rebel100-1npu --set batch_size"),
    ("lc-emu-device-memory", "load-check {ws}/emu --emulate --device-memory 1MiB"),
    ("lc-2npu-visual", "load-check {fake}/rebel100-2npu-batch4 --no-runtime --visual-device 3 --json"),
    ("serve-pass-refused", "serve {fake}/rebel100-1npu --dry-run -- --max-model-len 999"),
    (
        "serve-pass-ok",
        "serve {fake}/rebel100-1npu --dry-run --host 0.0.0.0 --port 9000 --served-model-name x -- --enforce-eager",
    ),
    ("serve-nopack", "serve {fake}/rebel100-1npu-batch4 --dry-run --no-vit-packing --json"),
    ("serve-missing", "serve {ws}/missing-dir --dry-run"),
    ("bench-json", "bench-serve {fake}/rebel100-1npu --dry-run --input-len 100 --output-len 10 --seed 3 --json"),
    ("dry-json-bad-preset", "compile --preset nope --dry-run --json"),
    ("compile-no-emulate", "compile --preset cpu-tiny-rbln --model {ws}/tiny -o {ws}/nothing"),
]
COMPARED_RUNS = ("infer-ref-json", "infer-emu-json")
COMPARE = [  # last: they read the two --json runs above
    ("compare", "compare {ws}/infer-emu-json.json {ws}/infer-ref-json.json"),
    ("compare-json", "compare {ws}/infer-emu-json.json {ws}/infer-ref-json.json --json"),
    ("compare-strict", "compare {ws}/infer-emu-json.json {ws}/infer-ref-json.json --strict-length --ignore-inputs"),
    ("compare-not-json", "compare {ws}/infer-emu-json.json {ws}/sizes.csv"),
]
COMMANDS = ("compile", "load-check", "infer", "bucket-plan", "serve", "bench-serve", "compare", "tiny-model")


def runs(ws: Path) -> list[tuple[str, list[str]]]:
    """(name, argv) for every run, in order; the first ones build the artifacts the later ones read."""
    where = {"ws": ws, "image": IMAGE, "fake": ws / "fake"}
    table = [*SETUP, *((f"help-{cmd}", f"{cmd} --help") for cmd in COMMANDS)]
    table += [(name.replace("{p}", p), args.replace("{p}", p)) for p in ALL_PRESETS for name, args in PER_PRESET]
    table += SINGLE
    for p in REBEL_PRESETS:
        table += [(name.replace("{p}", p), args.replace("{d}", f"{{fake}}/{p}")) for name, args in PER_FAKE_ARTIFACT]
    table += COMPARE
    return [(name, shlex.split(args.format(**where))) for name, args in table]


def _env(ws: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QVL_", "HF_", "COLUMNS", "LINES"))}
    env.update(
        HOME=str(ws / "home"),
        QVL_HOME=str(ws / "qvl-home"),
        HF_HOME=str(ws / "hf"),
        HF_HUB_OFFLINE="1",
        COLUMNS="120",
        TERM="dumb",
        PYTHONHASHSEED="0",
    )
    env.pop("NO_COLOR", None)
    return env


def capture(dest: Path) -> None:
    if WORKSPACE.exists():
        shutil.rmtree(WORKSPACE)
    (WORKSPACE / "home").mkdir(parents=True)
    write_fixtures(WORKSPACE)
    dest.mkdir(parents=True, exist_ok=True)
    qvl = str(Path(sys.executable).with_name("qvl"))
    env = _env(WORKSPACE)
    all_runs = runs(WORKSPACE)
    for name, argv in all_runs:
        proc = subprocess.run([qvl, *argv], cwd=WORKSPACE, env=env, capture_output=True, text=True, timeout=600)
        text = f"$ qvl {' '.join(argv)}\nexit {proc.returncode}\n--- stdout\n{proc.stdout}--- stderr\n{proc.stderr}"
        (dest / f"{name}.txt").write_text(mask(text))
        if name in COMPARED_RUNS:
            (WORKSPACE / f"{name}.json").write_text(proc.stdout)  # the compare runs read it unmasked
    print(f"{len(all_runs)} runs captured in {dest}")


def _normalised(text: str) -> str:
    """Whitespace runs as one space: masking a number of another width moves where rich wraps a line."""
    return " ".join(text.split())


def diff(a: Path, b: Path) -> int:
    names = sorted({p.name for p in a.glob("*.txt")} | {p.name for p in b.glob("*.txt")})
    missing = [n for n in names if not (a / n).is_file() or not (b / n).is_file()]
    exact = [n for n in names if n not in missing and (a / n).read_bytes() != (b / n).read_bytes()]
    differ = [n for n in exact if _normalised((a / n).read_text()) != _normalised((b / n).read_text())]
    for name in missing:
        print(f"missing on one side: {name}")
    for name in differ:
        print(f"differs: {name}")
    wrapped = len(exact) - len(differ)
    print(f"{len(missing) + len(differ)} of {len(names)} differ ({wrapped} more differ only in where whitespace falls)")
    return 1 if missing or differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("capture").add_argument("dest", type=Path)
    d = sub.add_parser("diff")
    d.add_argument("a", type=Path)
    d.add_argument("b", type=Path)
    args = parser.parse_args()
    if args.cmd == "capture":
        capture(args.dest)
        return 0
    return diff(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
