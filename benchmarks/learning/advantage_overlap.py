"""Several estimators' advantages on the same saved batches: where do they differ?

Reads the rollouts a finished run saved (``run.save_samples``: ``<run>/samples/iter_*.jsonl``, as every run of
``benchmarks/learning/estimators.py`` does) and computes, for each preset's ``algorithm`` section, the advantages
:func:`drmas_train.algorithm.sample_advantages.sample_advantages` gives those batches; no model is loaded and nothing
is trained. Each prompt group (``uid``) is one of two kinds:

* **outcome-flat**: every rollout of the group has the same outcome (``Sample.score``, the episode reward before
  penalties). A call's score there differs from another's only by the format penalties, so any advantage it gets
  is a format signal;
* **outcome-varied**: the rest, where the task's outcome separates the rollouts.

Per preset it prints the share of outcome-flat calls with a nonzero advantage (``|A| > 1e-9``) and their mean
``|A|``, the mean ``|A|`` in outcome-varied groups, and there, against the reference preset (the first one): the
Pearson correlation of the advantages, the number of calls of opposite sign, and per agent the RMS ratio
``sqrt(mean A^2 / mean A_ref^2)``. Estimators that need more than the samples (ReMax's greedy rollout, the
critic's values for GAE) are refused with exit 2.

    python benchmarks/learning/advantage_overlap.py runs/estimators/quickstart_math/seed_*
    python benchmarks/learning/advantage_overlap.py runs/estimators/quickstart_math_grpo/seed_* \\
        --presets quickstart_math_grpo quickstart_math quickstart_math_rloo

It prints one JSON object. Exit code 2 for a run directory without saved samples, or a preset it cannot evaluate.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from drmas_train.algorithm.advantages import needs_critic, needs_greedy_baseline
from drmas_train.algorithm.sample_advantages import sample_advantages
from drmas_train.collect.sample_io import load_samples
from drmas_train.collect.samples import Sample
from drmas_train.run.config import load_config

DEFAULT_PRESETS = ("quickstart_math", "quickstart_math_grpo", "quickstart_math_dr_grpo", "quickstart_math_rloo",
                   "quickstart_math_grpo_step", "quickstart_math_per_turn")  # fmt: skip
NONZERO = 1e-9


def outcome_flat(samples: Sequence[Sample]) -> np.ndarray:
    """(B,) bool: True for the calls of prompt groups (``uid``) whose trajectories all have the same ``score``."""
    outcomes: dict[Any, set] = defaultdict(set)
    for s in samples:
        outcomes[s.uid].add(s.score)
    return np.array([len(outcomes[s.uid]) == 1 for s in samples], dtype=bool)


def _mean(x: np.ndarray) -> float | None:
    return float(x.mean()) if x.size else None


def overlap(batches: Sequence[Sequence[Sample]], algorithms: dict[str, Any]) -> dict[str, Any]:
    """Advantages of each algorithm on every batch, compared (module docstring); the first algorithm is the reference.

    Args:
        batches: one list of samples per training iteration (advantages are computed per batch, as in training).
        algorithms: name -> the ``algorithm`` section of a training config (``estimator``, ``grouping``, ...).

    Returns:
        ``calls``, ``outcome_flat_share``, ``reference`` and per name ``estimator``, ``grouping``, ``outcome_flat``
        (``nonzero_share``, ``mean_abs``) and ``outcome_varied`` (``mean_abs``, and for the others
        ``corr_with_reference``, ``opposite_sign``, ``rms_ratio`` per agent).

    Raises:
        ValueError: no samples; an estimator that needs a greedy rollout or a critic.
    """
    names = list(algorithms)
    for name, a in algorithms.items():
        if needs_greedy_baseline(a.estimator) or needs_critic(a.estimator):
            raise ValueError(f"{name}: estimator {a.estimator!r} needs more than the saved samples (a greedy rollout "
                             "or the critic's values); accepted: estimators with a group or batch baseline")  # fmt: skip
    adv: dict[str, list[np.ndarray]] = defaultdict(list)
    flat, agents = [], []
    for samples in batches:
        flat.append(outcome_flat(samples))
        agents.append(np.array([s.agent_id for s in samples]))
        for name in names:
            adv[name].append(np.asarray(sample_advantages(samples, algorithms[name]), dtype=np.float64))
    if not flat or not sum(len(f) for f in flat):
        raise ValueError("no samples to compare")
    is_flat, agent = np.concatenate(flat), np.concatenate(agents)
    a = {name: np.concatenate(adv[name]) for name in names}
    ref, varied = a[names[0]], ~is_flat
    out: dict[str, Any] = {"calls": int(is_flat.size), "outcome_flat_share": float(is_flat.mean()), "reference": names[0],
                           "presets": {}}  # fmt: skip
    for name in names:
        x = a[name]
        row: dict[str, Any] = {
            "estimator": algorithms[name].estimator, "grouping": algorithms[name].grouping,
            "outcome_flat": {"nonzero_share": _mean(np.abs(x[is_flat]) > NONZERO), "mean_abs": _mean(np.abs(x[is_flat]))},
            "outcome_varied": {"mean_abs": _mean(np.abs(x[varied]))},
        }  # fmt: skip
        if name != names[0] and varied.sum() > 1:
            v = row["outcome_varied"]
            v["corr_with_reference"] = float(np.corrcoef(x[varied], ref[varied])[0, 1])
            v["opposite_sign"] = int((np.sign(x[varied]) * np.sign(ref[varied]) < 0).sum())
            v["rms_ratio"] = {}
            for g in sorted(set(agent[varied])):
                m = varied & (agent == g)
                if np.mean(ref[m] ** 2) > 0:
                    v["rms_ratio"][str(g)] = float(np.sqrt(np.mean(x[m] ** 2) / np.mean(ref[m] ** 2)))
        out["presets"][name] = row
    return out


def run_batches(run_dir: str | Path) -> list[list[Sample]]:
    """The saved batches of one run, in iteration order.

    Raises:
        FileNotFoundError: the run has no ``samples/iter_*.jsonl`` (trained without ``run.save_samples``).
    """
    files = sorted(Path(run_dir).glob("samples/iter_*.jsonl"))
    if not files:
        raise FileNotFoundError(f"{run_dir}: no samples/iter_*.jsonl (the run must be trained with run.save_samples=true)")
    return [load_samples(f) for f in files]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run directories with saved samples (their batches are pooled; paths that "
                   "are not directories are skipped)")
    p.add_argument("--presets", nargs="+", default=list(DEFAULT_PRESETS),
                   help=f"presets whose algorithm section is applied; the first is the reference (default {list(DEFAULT_PRESETS)})")  # fmt: skip
    args = p.parse_args(argv)
    try:
        runs = [r for r in args.runs if Path(r).is_dir()]  # seed_* also matches the runs' seed_<s>.log
        if not runs:
            raise FileNotFoundError(f"none of {args.runs} is a run directory")
        batches = [b for run in runs for b in run_batches(run)]
        algorithms = {name: load_config(name).algorithm for name in args.presets}
        result = overlap(batches, algorithms)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps({"runs": runs, **result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
