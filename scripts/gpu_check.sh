#!/usr/bin/env bash
# GPU check, for whenever one GPU is available: the benchmark (fp32 and bf16 autocast) and a
# 20-step training run, with logs and JSON under one folder. About 5-8 minutes on an H100/H200.
#
#   scripts/gpu_check.sh [OUT_DIR]          # default: $OUT if set, else outputs/gpu_check
#
# Environment knobs:
#   PYTHON=python3        interpreter holding a CUDA torch, transformers, accelerate
#   SIZES=10m,135m        bench sizes (135m: SmolLM2-135M's shape, random weights, no download;
#                         add smollm2 where builtin:smollm2-135m-instruct is cached/installable)
#   TRAIN_MODEL=builtin:tiny   model of the 20-step run (builtin:smollm2-135m-instruct for the demo)
#   ATTN=sdpa             attention of the training run (flash_attention_2 if flash-attn is installed)
#   SKIP_BENCH=1 / SKIP_TRAIN=1
#
# The package need not be installed: the repository root goes on PYTHONPATH. Missing optional
# packages (omegaconf, datasets, wandb, math-verify) are not needed by these commands.
set -uo pipefail
case "${1:-}" in
    -h | --help)  # the comment block above, without its '# '
        sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0"
        exit 0
        ;;
    -*)
        echo "gpu_check.sh: unknown option $1 (usage: scripts/gpu_check.sh [OUT_DIR]; --help)" >&2
        exit 2
        ;;
esac
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT_DIR=${1:-${OUT:-outputs/gpu_check}}
mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
SIZES=${SIZES:-10m,135m}
TRAIN_MODEL=${TRAIN_MODEL:-builtin:tiny}
ATTN=${ATTN:-sdpa}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled
export TOKENIZERS_PARALLELISM=false
status=0

echo "== environment" | tee "$OUT_DIR/env.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$OUT_DIR/env.txt"
"$PY" - <<'EOF' 2>&1 | tee -a "$OUT_DIR/env.txt"
import importlib, sys
import torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
print("gpu", torch.cuda.is_available() and torch.cuda.get_device_name(0))
for name in ("transformers", "accelerate", "flash_attn", "omegaconf", "datasets"):
    try:
        mod = importlib.import_module(name)
        print(name, getattr(mod, "__version__", "?"))
    except Exception as exc:  # noqa: BLE001
        print(name, "missing:", type(exc).__name__)
if not torch.cuda.is_available():
    sys.exit("no CUDA device: this script is for a GPU machine")
EOF
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1

run() {  # run NAME CMD...: log to $OUT_DIR/NAME.log, keep going on failure
    local name=$1; shift
    echo "== $name: $*"
    local t0=$SECONDS
    if "$@" >"$OUT_DIR/$name.log" 2>&1; then
        echo "   ok ($((SECONDS - t0)) s)"
    else
        echo "   FAILED ($((SECONDS - t0)) s), last lines:"; status=1
    fi
    tail -n 12 "$OUT_DIR/$name.log" | sed 's/^/   | /'
}

if [ "${SKIP_BENCH:-0}" != 1 ]; then
    run bench_fp32 "$PY" scripts/bench/bench.py --device cuda --sizes "$SIZES" --threads 4 \
        --repeats 7 --rl-steps 4 --json "$OUT_DIR/bench_fp32.json"
    run bench_bf16 env ACCELERATE_MIXED_PRECISION=bf16 "$PY" scripts/bench/bench.py --device cuda \
        --amp bf16 --sizes "$SIZES" --threads 4 --repeats 7 --rl-steps 4 \
        --json "$OUT_DIR/bench_bf16.json"
fi

if [ "${SKIP_TRAIN:-0}" != 1 ]; then
    # 20 steps, bf16 autocast through Accelerate, packed micro-batches; the YAML's only
    # interpolations are overridden so omegaconf is not needed
    run train_20 env ACCELERATE_MIXED_PRECISION=bf16 "$PY" -m areal_m2po.train \
        --config configs/tiny.yaml \
        total_train_steps=20 \
        "output_dir=$OUT_DIR/train_20" \
        "actor.path=$TRAIN_MODEL" "ref.path=$TRAIN_MODEL" \
        "actor.attn_implementation=$ATTN" \
        actor.mb_spec.packing=true \
        actor.kl_ctl=0.01 \
        num_threads=4 \
        stats_logger.progress_bar=false
    "$PY" - "$OUT_DIR/train_20/metrics.jsonl" <<'EOF' 2>&1 | tee "$OUT_DIR/train_20_summary.txt"
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
steps = [r for r in rows if "timing/step_s" in r]
print("steps logged:", len(steps))
for key in ("timing/step_s", "timing/gen_s", "timing/prox_s", "timing/ref_s", "timing/update_s"):
    vals = [r[key] for r in steps[1:] if key in r]
    if vals:
        print(f"{key}: median {statistics.median(vals):.3f} s")
last = steps[-1] if steps else {}
for key in ("reward/mean", "m2po/masked_fraction", "actor/grad_norm", "eval/accuracy"):
    if key in last:
        print(f"{key} (last step): {last[key]}")
EOF
fi

echo "== results in $OUT_DIR"
grep -h "^[a-z_0-9@]*=" "$OUT_DIR"/bench_*.log 2>/dev/null | sed 's/^/   /'
exit $status
