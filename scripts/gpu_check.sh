#!/usr/bin/env bash
# One-command GPU check (under 8 minutes, offline): the drmas trainer on a tiny random Qwen3 in bf16 on CUDA
# (rollout + PPO update, single process), then a 1-rank FSDP2 update through torch.distributed (nccl) and a
# sharded checkpoint round trip. Prints ONE JSON line on stdout (tokens/s, peak GPU memory, loss finite,
# versions, device name); logs go to stderr. Details and exit codes: scripts/gpu_check.py.
# When `import vllm` works and the device is CUDA, a vLLM generation worker step follows (engine start-up, sleep,
# wake-up + in-place weight push, generation; scripts/gpu_check_vllm.py) and its figures are the line's "vllm"
# object (its "ok" joins the line's); otherwise "vllm" is "not installed" (or "skipped: ..." on --device cpu).
#
#   bash scripts/gpu_check.sh                      # on a machine with one NVIDIA GPU
#   bash scripts/gpu_check.sh --device cpu --hidden 64 --iterations 2 --tasks 2   # the same path on CPU
#   PYTHON=/path/to/python DRMAS_GPU_CHECK_TIMEOUT=300 bash scripts/gpu_check.sh
#
# Python: $PYTHON, else ./.venv/bin/python when present, else python3. Needs torch + transformers + drmas's
# dependencies; no weights, no internet, no vLLM, no Ray. Exit codes: 0 ok, 1 failure, 2 bad arguments,
# 3 no CUDA / missing package, 4 non-finite loss, 124 time limit ($DRMAS_GPU_CHECK_TIMEOUT s, default 450;
# the vLLM step gets what is left of 470 s, at least 90 s, or $DRMAS_GPU_CHECK_VLLM_TIMEOUT).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"
else PY="python3"; fi
LIMIT="${DRMAS_GPU_CHECK_TIMEOUT:-450}"
command -v "$PY" >/dev/null 2>&1 || { echo "{\"ok\": false, \"error\": \"python interpreter '$PY' not found; set PYTHON=...\"}"; exit 3; }

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
case " $* " in *" -h "*|*" --help "*) exec "$PY" "$ROOT/scripts/gpu_check.py" "$@" ;; esac
DEVICE=cuda
prev=""
for arg in "$@"; do
  case "$arg" in --device=*) DEVICE="${arg#--device=}" ;; esac
  [ "$prev" = "--device" ] && DEVICE="$arg"
  prev="$arg"
done

MAIN_OUT="$(mktemp)"; VLLM_OUT="$(mktemp)"
trap 'rm -f "$MAIN_OUT" "$VLLM_OUT"' EXIT
timeout --kill-after=20 "$LIMIT" "$PY" "$ROOT/scripts/gpu_check.py" "$@" >"$MAIN_OUT"
rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "{\"ok\": false, \"error\": \"gpu_check did not finish within $LIMIT s (DRMAS_GPU_CHECK_TIMEOUT); rerun with smaller --iterations/--tasks/--max-new-tokens\"}"
  exit 124
fi
MAIN_LINE="$(tail -n 1 "$MAIN_OUT")"

# the vLLM generation worker step (only where vLLM is importable; never installs anything)
VRC=0
if ! "$PY" -c "import vllm" >/dev/null 2>&1; then
  VLLM_JSON='"not installed"'
elif [ "$DEVICE" != "cuda" ]; then
  VLLM_JSON='"skipped: the vLLM step needs --device cuda"'
elif [ "$rc" -eq 2 ] || [ "$rc" -eq 3 ]; then
  VLLM_JSON='"skipped: the main check could not run"'
else
  VLIMIT="${DRMAS_GPU_CHECK_VLLM_TIMEOUT:-$(( 470 - SECONDS > 90 ? 470 - SECONDS : 90 ))}"
  VLLM_ENABLE_V1_MULTIPROCESSING=0 timeout --kill-after=20 "$VLIMIT" "$PY" "$ROOT/scripts/gpu_check_vllm.py" >"$VLLM_OUT"
  VRC=$?
  if [ "$VRC" -eq 124 ] || [ "$VRC" -eq 137 ]; then
    VLLM_JSON="{\"ok\": false, \"error\": \"the vLLM step did not finish within $VLIMIT s (DRMAS_GPU_CHECK_VLLM_TIMEOUT)\"}"
  else
    VLLM_JSON="$(tail -n 1 "$VLLM_OUT")"
  fi
fi

# one JSON line: the main check's, with "vllm" added (a vLLM step that ran and failed makes the line's ok false)
"$PY" - "$MAIN_LINE" "$VLLM_JSON" <<'PYEOF'
import json, sys
try:
    line = json.loads(sys.argv[1])
except ValueError:
    line = {"ok": False, "error": "gpu_check.py printed no JSON line: " + sys.argv[1][-300:]}
try:
    vllm = json.loads(sys.argv[2])
except ValueError:
    vllm = {"ok": False, "error": "gpu_check_vllm.py printed no JSON line: " + sys.argv[2][-300:]}
line["vllm"] = vllm
if isinstance(vllm, dict):
    line["ok"] = bool(line.get("ok")) and bool(vllm.get("ok"))
print(json.dumps(line), flush=True)
PYEOF
if [ "$rc" -ne 0 ]; then exit "$rc"; fi
if [ "$VRC" -ne 0 ]; then exit 1; fi
exit 0
