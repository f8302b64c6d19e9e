"""Does the README's main job learn? Runs ``drmas train`` on a preset and prints one JSON object with the held-out
validation at every evaluation, the paired gain over the initial weights, wall time and peak RSS.

The figures in docs/quickstart.md come from ``drmas train`` runs of these presets; this script runs one and prints them:

    HF_HUB_OFFLINE=1 python benchmarks/learning/quickstart.py                          # quickstart_math, ~9-11 min on 2 cores
    HF_HUB_OFFLINE=1 python benchmarks/learning/quickstart.py --config quickstart_math_grpo
    HF_HUB_OFFLINE=1 python benchmarks/learning/quickstart.py seed=1                   # dotted overrides as drmas train
    python benchmarks/learning/quickstart.py --summarize runs/quickstart_search        # a finished run's figures, no training

Output fields: ``config``, ``overrides``, ``validation`` (per evaluated iteration: ``avg@k``, ``stderr``, and from the
second evaluation on ``gain`` / ``gain_stderr``, paired over the same tasks), ``gain_over_stderr`` (the last gain
in standard errors), ``train_accuracy`` (per iteration), ``valid_action_ratio`` (per agent, per iteration),
``wall_time_s`` (``train()`` including model load and checkpoints), ``peak_rss_gb`` (this process's ``ru_maxrss``),
``threads``, ``load_average`` (1-minute load before the start: a busy machine slows the run, not its numbers).
With ``--summarize RUN_DIR`` it trains nothing and prints the learning figures of that run directory instead, with
``config`` (the run's ``config.yaml`` name and seed), ``iteration_s`` (``perf/iteration_s`` per iteration) and
``wall_time_s`` from its ``summary.json`` (``train()``'s time after model load; no peak RSS or load: measure those
around the run, e.g. ``/usr/bin/time -v``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path


def summarize(rows: list[dict]) -> dict:
    """The learning figures of a run's metrics rows (``metrics.jsonl``).

    Raises:
        ValueError: the rows hold no validation (the preset has ``eval.every: 0``).
    """
    validation = []
    for row in rows:
        key = next((k for k in row if k.startswith("val/avg@") and "_" not in k.split("@", 1)[1]), None)
        if key is None:
            continue
        entry = {"iteration": row["iteration"], key[4:]: row[key], "stderr": row.get(key + "_stderr")}
        if key + "_gain" in row:
            entry.update(gain=row[key + "_gain"], gain_stderr=row[key + "_gain_stderr"])
        validation.append(entry)
    if not validation:
        raise ValueError("no validation rows: set eval.every > 0 (and eval.before_train=true for the gain)")
    last = validation[-1]
    agents = sorted({k.split("/")[1] for row in rows for k in row if k.startswith("reward/") and k.endswith("/valid_action_ratio")})
    return {
        "validation": validation,
        "gain_over_stderr": last["gain"] / last["gain_stderr"] if last.get("gain_stderr") else None,
        "train_accuracy": [row["rollout/accuracy"] for row in rows if "rollout/accuracy" in row],
        "valid_action_ratio": {a: [row[f"reward/{a}/valid_action_ratio"] for row in rows
                                   if f"reward/{a}/valid_action_ratio" in row] for a in agents},  # fmt: skip
    }


def summarize_run(run_dir: Path) -> dict:
    """:func:`summarize` of a finished run directory, with its seed, per-iteration seconds and wall time.

    Raises:
        FileNotFoundError: no ``metrics.jsonl`` or ``summary.json`` there (not a finished run). ValueError: as
            :func:`summarize`.
    """
    import yaml

    from drmas_train.run.metrics_log import read_metrics

    for name in ("metrics.jsonl", "summary.json", "config.yaml"):
        if not (run_dir / name).is_file():
            raise FileNotFoundError(f"{run_dir / name} is missing: --summarize needs a finished run directory")
    rows = read_metrics(run_dir / "metrics.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    return {"run_dir": str(run_dir), "seed": config.get("seed"), "estimator": config.get("algorithm", {}).get("estimator"),
            **summarize(rows), "iteration_s": [row["perf/iteration_s"] for row in rows if "perf/iteration_s" in row],
            "wall_time_s": round(float(summary["wall_time_s"]), 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="quickstart_math", help="preset name or YAML path")
    parser.add_argument("--run-dir", default=None, help="run directory (default: a new temporary one)")
    parser.add_argument("--summarize", default=None, metavar="RUN_DIR",
                        help="train nothing: print the figures of this finished run directory")  # fmt: skip
    parser.add_argument("overrides", nargs="*", help="dotted overrides, as drmas train")
    args = parser.parse_args(argv)
    if args.summarize is not None:
        try:
            out = summarize_run(Path(args.summarize))
        except (FileNotFoundError, ValueError) as err:
            parser.error(str(err))
        print(json.dumps(out))
        return out

    from drmas_train.run.config import load_config
    from drmas_train.run.metrics_log import read_metrics
    from drmas_train.run.trainer import train

    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="drmas-quickstart-")) / "run"
    cfg = load_config(args.config, [*args.overrides, f"run.dir={run_dir}", "run.progress=false"])
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    train(cfg)
    wall = time.perf_counter() - t0
    out = {"config": args.config, "overrides": args.overrides, "run_dir": str(run_dir),
           **summarize(read_metrics(run_dir / "metrics.jsonl")), "wall_time_s": round(wall, 1),
           "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
           "threads": cfg.run.num_threads or len(os.sched_getaffinity(0)), "load_average": load}  # fmt: skip
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
