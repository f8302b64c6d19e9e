#!/usr/bin/env bash
# One-command GPU check (under 8 minutes, offline): the drmas trainer on a tiny random Qwen3 in bf16 on CUDA
# (rollout + PPO update, single process), then a 1-rank FSDP2 update through torch.distributed (nccl) and a
# sharded checkpoint round trip. Prints ONE JSON line on stdout (tokens/s, peak GPU memory, loss finite,
# versions, device name); logs go to stderr. Details and exit codes: scripts/gpu_check.py.
#
#   bash scripts/gpu_check.sh                      # on a machine with one NVIDIA GPU
#   bash scripts/gpu_check.sh --device cpu --hidden 64 --iterations 2 --tasks 2   # the same path on CPU
#   PYTHON=/path/to/python DRMAS_GPU_CHECK_TIMEOUT=300 bash scripts/gpu_check.sh
#
# Python: $PYTHON, else ./.venv/bin/python when present, else python3. Needs torch + transformers + drmas's
# dependencies; no weights, no internet, no vLLM, no Ray. Exit codes: 0 ok, 1 failure, 2 bad arguments,
# 3 no CUDA / missing package, 4 non-finite loss, 124 time limit ($DRMAS_GPU_CHECK_TIMEOUT s, default 450).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"
else PY="python3"; fi
LIMIT="${DRMAS_GPU_CHECK_TIMEOUT:-450}"
command -v "$PY" >/dev/null 2>&1 || { echo "{\"ok\": false, \"error\": \"python interpreter '$PY' not found; set PYTHON=...\"}"; exit 3; }

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
timeout --kill-after=20 "$LIMIT" "$PY" "$ROOT/scripts/gpu_check.py" "$@"
rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "{\"ok\": false, \"error\": \"gpu_check did not finish within $LIMIT s (DRMAS_GPU_CHECK_TIMEOUT); rerun with smaller --iterations/--tasks/--max-new-tokens\"}"
  exit 124
fi
exit "$rc"
