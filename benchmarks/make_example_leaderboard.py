"""Regenerate ``benchmarks/leaderboard_example/``: a small leaderboard from the built-in envs' synthetic tasks.

Scripted baselines only (no model, a few seconds on CPU): ``oracle``, ``random`` and, on the search envs,
``no-search``; every built-in env on its own default (offline, seeded) tasks: reasoning-gym ``gsm_symbolic``
for math, the synthetic encyclopedia for search. ``--limit`` tasks x ``--k`` samples per env.

    python benchmarks/make_example_leaderboard.py            # rewrites benchmarks/leaderboard_example/

Layout: ``results/<policy>/`` (``summary.json`` + ``episodes.jsonl``, docs/results-schema.md) and
``leaderboard.{md,html,json}`` + ``leaderboard_<suite>.png``. Prints the written paths as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

MATH_ENVS = ["math-solver-v0", "math-solver-verifier-v0", "math-generator-verifier-refiner-v0"]
SEARCH_ENVS = ["search-orchestrator-v0", "search-r1-v0"]
HERE = Path(__file__).resolve().parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(HERE / "leaderboard_example"))
    p.add_argument("--limit", type=int, default=5, help="tasks per env")
    p.add_argument("--k", type=int, default=4, help="samples per task")
    args = p.parse_args()

    from drmas_train.eval.evaluate import EvalConfig, evaluate
    from drmas_train.eval.leaderboard import write_leaderboard
    from drmas_train.eval.results import load_run

    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    plans = {
        "oracle": MATH_ENVS + SEARCH_ENVS,
        "random": MATH_ENVS + SEARCH_ENVS,
        "no-search": SEARCH_ENVS,
    }
    for policy, envs in plans.items():
        cfg = EvalConfig(envs=envs, limit=args.limit, k=args.k, policy=policy, seed=0)
        evaluate(cfg, out / "results" / policy, progress=False)
    os.chdir(out)  # so the pages name the run directories relative to the leaderboard, not by absolute path
    runs = [load_run(Path("results") / policy, episodes=False) for policy in plans]
    written = write_leaderboard(runs, ".", title="drmas example leaderboard (scripted baselines, synthetic tasks)")
    print(json.dumps({k: str(out / v) for k, v in written.items()}, indent=2))


if __name__ == "__main__":
    main()
