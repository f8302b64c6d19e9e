"""The math quickstart in float32 vs bf16 (``optim.autocast=bf16 rollout.autocast=bf16``), paired by seed: does bf16
learn as much? Prints one JSON object.

Both arms are ``benchmarks/learning/estimators.py`` runs of the ``quickstart_math`` preset, seeds 0-2: float32 from
``benchmarks/learning/estimators/results.json`` (the estimator leaderboard's ``drmas`` row), bf16 from
``benchmarks/learning/precision/results.json`` (written by
``python benchmarks/learning/estimators.py --presets quickstart_math --seeds 3 --threads 2 --runs runs/precision_bf16
--out benchmarks/learning/precision optim.autocast=bf16 rollout.autocast=bf16``). A seed fixes the training and
held-out tasks, so the arms are paired by seed; within a seed, by held-out task (final avg@4 per task).

The rule (issue 39): bf16 becomes the quickstart's default only if its held-out gain is within one standard error of
float32's (the SE of float32's mean gain over seeds) — ``verdict`` says whether it is.

    python benchmarks/learning/precision_study.py
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLOAT32 = ROOT / "benchmarks" / "learning" / "estimators" / "results.json"
BF16 = ROOT / "benchmarks" / "learning" / "precision" / "results.json"


def _runs(path: Path) -> dict[int, dict]:
    return {r["seed"]: r for r in json.loads(path.read_text())["runs"] if r["preset"] == "quickstart_math"}


def _mean_se(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else float("nan")


def study(float32: Path = FLOAT32, bf16: Path = BF16) -> dict:
    """Per seed gains of both arms, their paired difference (bf16 - float32) with its SE over seeds, the per-task
    paired difference of final scores pooled over seeds, and the verdict of the one-SE rule."""
    a, b = _runs(float32), _runs(bf16)
    seeds = sorted(set(a) & set(b))
    per_seed = {s: {"float32": a[s]["gain"], "bf16": b[s]["gain"], "bf16_minus_float32": b[s]["gain"] - a[s]["gain"]}
                for s in seeds}  # fmt: skip
    f_mean, f_se = _mean_se([a[s]["gain"] for s in seeds])
    b_mean, b_se = _mean_se([b[s]["gain"] for s in seeds])
    d_mean, d_se = _mean_se([per_seed[s]["bf16_minus_float32"] for s in seeds])
    task_diffs = [b[s]["final_scores"][t] - a[s]["final_scores"][t] for s in seeds for t in a[s]["final_scores"]
                  if t in b[s]["final_scores"]]  # fmt: skip
    t_mean, t_se = _mean_se(task_diffs)
    return {
        "seeds": seeds,
        "per_seed": per_seed,
        "gain": {"float32": [f_mean, f_se], "bf16": [b_mean, b_se]},
        "bf16_minus_float32": {"by_seed": [d_mean, d_se], "final_by_task": [t_mean, t_se], "tasks": len(task_diffs)},
        "wall_time_s": {"float32": [a[s].get("wall_time_s") for s in seeds], "bf16": [b[s].get("wall_time_s") for s in seeds]},
        "verdict": "bf16 learns as much (within one SE of float32's gain)" if abs(b_mean - f_mean) <= f_se
        else "bf16 does not meet the rule: its gain is more than one SE of float32's from float32's",
    }


if __name__ == "__main__":
    print(json.dumps(study(), indent=1))
