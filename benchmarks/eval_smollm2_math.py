"""End-to-end eval: SmolLM2-135M-Instruct on math-solver-verifier-v0 (GSM8K + MATH-500) vs oracle and random.

Runs three ``drmas eval`` runs over the first ``--limit`` problems of each file with ``--k`` samples per task
(reference sampling: temperature 0.6, top-p 0.95), ranks them with ``drmas leaderboard`` and prints one JSON
object: per run, avg@k / pass@k per data source, per-agent valid-action rate, and wall times.

    python benchmarks/eval_smollm2_math.py --out /tmp/drmas-eval --limit 50 --k 4 --max-new-tokens 256

CPU-heavy (about 400 episodes x up to 3 agent calls); writes nothing inside the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="/tmp/drmas-eval", help="output root (runs/ and leaderboard/ are created)")
    p.add_argument("--data-dir", default=os.environ.get("DRMAS_SHARED_DATA", str(DATA)))
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch-tasks", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", default="smollm2-135m-instruct")
    args = p.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from drmas_train.eval.evaluate import EvalConfig, evaluate
    from drmas_train.eval.leaderboard import write_leaderboard
    from drmas_train.eval.results import load_run

    out = Path(args.out)
    data = [str(Path(args.data_dir) / "gsm8k_test.jsonl"), str(Path(args.data_dir) / "math500_test.jsonl")]
    common = dict(envs=["math-solver-verifier-v0"], data=data, limit=args.limit, k=args.k, seed=0)
    configs = {
        "oracle": EvalConfig(policy="oracle", **common),
        "random": EvalConfig(policy="random", **common),
        args.model: EvalConfig(
            policy="llm", model=args.model, max_new_tokens=args.max_new_tokens, batch_tasks=args.batch_tasks,
            label="SmolLM2-135M-Instruct", transcripts=True, **common,
        ),
    }
    report: dict = {"limit": args.limit, "k": args.k, "max_new_tokens": args.max_new_tokens, "runs": {}}
    runs = []
    for name, cfg in configs.items():
        t0 = time.perf_counter()
        run = evaluate(cfg, out / "runs" / name, progress=True)
        wall = time.perf_counter() - t0
        runs.append(load_run(run.path, episodes=False))
        cells = run.summary["metrics"]["math-solver-verifier-v0"]
        report["runs"][name] = {
            "wall_time_s": round(wall, 1),
            "episodes": run.summary["num_episodes"],
            **{
                src: {
                    "avg@k": round(c["avg@k"]["value"], 4),
                    "avg@k_se": c["avg@k"]["stderr"],
                    "pass@k": round(c["pass@k"][str(args.k)]["value"], 4),
                    "any_of_k": round(c["any_of_k"][str(args.k)]["value"], 4),
                    "valid_action_rate": {a: v["valid_action_rate"] for a, v in c["agents"].items()},
                    "tokens_out_per_episode": {a: round(v["tokens_out"], 1) for a, v in c["agents"].items()},
                    "num_turns": round(c["num_turns"]["value"], 3),
                }
                for src, c in cells.items()
            },
        }
        print(json.dumps({name: report["runs"][name]}), flush=True)
    written = write_leaderboard(runs, out / "leaderboard", title="SmolLM2-135M-Instruct on math-solver-verifier-v0")
    report["leaderboard"] = {k: str(v) for k, v in written.items()}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
