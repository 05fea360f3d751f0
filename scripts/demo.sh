#!/usr/bin/env bash
# make demo: the main job end to end on this machine, no NPU and no network needed.
# Tiny Qwen3-VL (real architecture, random weights) -> reference-backend compile -> bucket plan -> infer
# -> load-check; the same model through optimum-rbln's real compile/load/generate on qvl's emulated Rebel100
# (compared with the reference); then what the real Rebel100 baseline would do (dry run with the memory verdict).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
export COLUMNS="${COLUMNS:-120}"  # wide enough for the tables when the output is not a terminal
IMAGE=assets/demo.jpg

# bold headings only on a terminal (a log file gets plain text), and never with NO_COLOR
if [[ -t 1 && -z "${NO_COLOR:-}" ]]; then BOLD=$'\033[1m' PLAIN=$'\033[0m'; else BOLD='' PLAIN=''; fi
step() { printf '\n%s== %s%s\n' "$BOLD" "$*" "$PLAIN"; }

step "qvl tiny-model: the offline tiny Qwen3-VL (created once, reused)"
qvl tiny-model

step "qvl compile --preset cpu-tiny: the reference backend's compile (artifacts + manifest)"
qvl compile --preset cpu-tiny --force

step "qvl bucket-plan: which ViT bucket the demo image lands in"
qvl bucket-plan --preset cpu-tiny "$IMAGE" --size 1920x1080

step "qvl infer: generation on the bundled image (bucket, decoder graph, timings, memory)"
# No DIR and no --preset: infer runs what `qvl compile` just wrote.
qvl infer --image "$IMAGE" --prompt "Describe this image." --max-new-tokens 24

step "qvl load-check: layout, manifest hashes, placement, memory, runtime"
qvl load-check

step "qvl compile --preset cpu-tiny-rbln --emulate: optimum-rbln's real compile for RBLN-CR13 on qvl's CPU emulator (emulated)"
qvl compile --preset cpu-tiny-rbln --emulate --force

step "qvl load-check --emulate: runtimes on the emulator; emulated per-graph sizes beside the planner's estimate"
qvl load-check --emulate

step "qvl infer --emulate and qvl compare: optimum-rbln's generate on the emulator against the reference backend"
RUNS="$(mktemp -d)"
trap 'rm -rf "$RUNS"' EXIT
qvl infer --preset cpu-tiny-rbln --emulate --image "$IMAGE" --prompt "Describe this image." --max-new-tokens 24 \
  --json >"$RUNS/emulated.json"
qvl infer --preset cpu-tiny --image "$IMAGE" --prompt "Describe this image." --max-new-tokens 24 \
  --json >"$RUNS/reference.json"
qvl compare "$RUNS/emulated.json" "$RUNS/reference.json"

step "qvl compile --preset rebel100-1npu --dry-run: the Model Zoo baseline on one Rebel100"
qvl compile --preset rebel100-1npu --dry-run

step "the document's batch-4 / 262144 case: the planner says no before any compile, and why"
qvl compile --preset rebel100-1npu-batch4 --set max_seq_len=262144 --dry-run || echo "(exit $?: does not fit, as the product document reports)"

step "ViT packing: a 5-minute 720p video and 8 small images in one request, one call per segment vs packed"
printf '%s\n' '{"width": 1280, "height": 720, "frames": 9000, "fps": 30}' '{"width": 320, "height": 240, "images": 8}' \
  >"$RUNS/packing.jsonl"
qvl bucket-plan --preset rebel100-1npu-vit-buckets --workload "$RUNS/packing.jsonl"

step "pictures (--plot): where a mixed workload lands in the buckets, the batch-4 / 262144 memory per device, and what qvl tune traded (about a second)"
mkdir -p qvl-out
printf '%s\n' '{"width": 1280, "height": 720, "frames": 9000, "fps": 30}' '{"width": 320, "height": 240, "images": 8, "count": 20}' \
  '{"width": 1920, "height": 1080, "count": 40}' '{"width": 800, "height": 600, "count": 120}' \
  '{"width": 1024, "height": 768, "count": 60}' '{"width": 3000, "height": 2000, "count": 10}' >"$RUNS/mixed.jsonl"
qvl bucket-plan --preset rebel100-1npu-vit-buckets --workload "$RUNS/mixed.jsonl" --optimize 3 \
  --plot qvl-out/bucket-plan.png >/dev/null
qvl compile --preset rebel100-1npu-batch4 --set max_seq_len=262144 --dry-run --plot qvl-out/memory.png >/dev/null \
  || echo "  (exit $? as expected: the picture shows why batch 4 at 262144 does not fit beside the ViT on one card)"
qvl tune --workload "$RUNS/mixed.jsonl" --context 32768 --min-batch 4 --plot qvl-out/tune.png >/dev/null
echo "bucket plan: qvl-out/bucket-plan.png   memory: qvl-out/memory.png   tune: qvl-out/tune.png"

step "ViT packing at run time: three images in one request on the emulator, unpacked then packed (emulated)"
for flag in --no-vit-packing ""; do
  qvl infer --preset cpu-tiny-rbln --emulate $flag --image "$IMAGE" --image "$IMAGE" --image "$IMAGE" \
    --prompt "Compare them." --max-new-tokens 8 | grep "ViT:"
done

step "qvl infer --batch-file --output --workers 2 --emulate: two emulated NPUs on a local Ray (no dashboard, no usage stats), one line per request as it completes (emulated)"
# 12 requests: the two workers load side by side and a short job could end before the slower one is ready
for i in $(seq 1 12); do printf '{"id": "req-%s", "prompt": "Describe this image.", "image": "%s"}\n' "$i" "$PWD/$IMAGE"; done \
  >"$RUNS/batch.jsonl"
rc=0
QVL_EMULATOR_DEVICES=2 qvl infer --preset cpu-tiny-rbln --emulate --batch-file "$RUNS/batch.jsonl" \
  --output "$RUNS/results.jsonl" --workers 2 --max-new-tokens 8 || rc=$?
if [[ $rc == 3 ]]; then echo "(exit 3: Ray is not installed; make install adds the [ray] extra)"; elif [[ $rc != 0 ]]; then exit $rc; fi
echo "results.jsonl: $(if [[ -f "$RUNS/results.jsonl" ]]; then wc -l <"$RUNS/results.jsonl"; else echo 0; fi) lines for 12 requests"

step "Qwen3-VL-MoE on the emulator: the tiny MoE (4 experts, top 2, one dense layer) through optimum-rbln's RBLNQwen3VLMoeForConditionalGeneration and custom_moe_glu (emulated), against the reference backend"
qvl tiny-model --moe
qvl compile --preset cpu-tiny-moe-rbln --emulate --force
qvl load-check --emulate
qvl infer --preset cpu-tiny-moe-rbln --emulate --image "$IMAGE" --prompt "Describe this image." --max-new-tokens 24 \
  --json >"$RUNS/moe-emulated.json"
qvl compile --preset cpu-tiny-moe --force
qvl infer --preset cpu-tiny-moe --image "$IMAGE" --prompt "Describe this image." --max-new-tokens 24 \
  --json >"$RUNS/moe-reference.json"
qvl compare "$RUNS/moe-emulated.json" "$RUNS/moe-reference.json"

step "Qwen3-VL-30B-A3B on one Rebel100 (every expert in bf16 on the card), and 235B-A22B answered honestly"
qvl compile --preset rebel100-30b-a3b --dry-run
qvl compile --preset rebel100-1npu --model Qwen/Qwen3-VL-235B-A22B-Instruct --dry-run >/dev/null \
  || echo "(exit $?: 235B-A22B does not fit one Rebel100: its weights alone are 437 GiB)"
