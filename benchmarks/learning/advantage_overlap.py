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
Pearson correlation of the advantages (null when either is constant), the number of calls of opposite sign (both
nonzero), and per agent the RMS ratio ``sqrt(mean A^2 / mean A_ref^2)`` (null where the reference's is 0). A call
whose score is NaN counts as its own outcome. Estimators that need more than the samples (ReMax's greedy rollout, the
critic's values for GAE) or shape the rewards after the samples were saved (``algorithm.overlong_buffer``,
``algorithm.reward_kl_coef``) are refused with exit 2. GiGPO's discounted step returns (``gamma`` < 1) need the env's
step (``metadata["reference_env_step"]``): read from the env of each run's ``config.yaml``, or ``--env-step``.

    python benchmarks/learning/advantage_overlap.py runs/estimators/quickstart_math/seed_*
    python benchmarks/learning/advantage_overlap.py runs/estimators/quickstart_math_grpo/seed_* \\
        --presets quickstart_math_grpo quickstart_math quickstart_math_rloo

Each run is also checked against its own training (``training_deviation``): its ``algorithm`` applied here must give
each agent the advantage mean and std its ``metrics.jsonl`` logged (0 up to rounding; null when not checkable).

It prints one JSON object. Exit code 2 for a path that does not exist, a run directory without saved samples, or a
preset it cannot evaluate.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from drmas_train.algorithm.advantages import effective_grouping, needs_critic, needs_greedy_baseline
from drmas_train.algorithm.sample_advantages import sample_advantages
from drmas_train.collect.sample_io import load_samples
from drmas_train.collect.samples import Sample
from drmas_train.run.config import from_yaml, load_config
from drmas_train.run.metrics_log import read_metrics

DEFAULT_PRESETS = ("quickstart_math", "quickstart_math_grpo", "quickstart_math_dr_grpo", "quickstart_math_rloo",
                   "quickstart_math_reinforce_pp_baseline", "quickstart_math_reinforce_pp", "quickstart_math_grpo_step",
                   "quickstart_math_per_turn", "quickstart_math_gigpo", "quickstart_math_grpo_passk")  # fmt: skip
ENV_STEPS = ("round", "episode")
NONZERO = 1e-9


def _outcome(score: Any) -> Any:
    return "nan" if isinstance(score, float) and math.isnan(score) else score


def outcome_flat(samples: Sequence[Sample]) -> np.ndarray:
    """(B,) bool: True for the calls of prompt groups (``uid``) whose trajectories all have the same ``score``
    (NaN: an outcome of its own)."""
    outcomes: dict[Any, set] = defaultdict(set)
    for s in samples:
        outcomes[s.uid].add(_outcome(s.score))
    return np.array([len(outcomes[s.uid]) == 1 for s in samples], dtype=bool)


def needs_env_step(algorithm: Any) -> bool:
    """Whether the advantages depend on the env's step: GiGPO with discounted step returns (``gamma`` < 1)."""
    return algorithm.estimator == "gigpo" and algorithm.gamma != 1


def check_evaluable(name: str, algorithm: Any) -> None:
    """Raises ValueError when ``algorithm``'s advantages need more than the saved samples."""
    a = algorithm
    if needs_greedy_baseline(a.estimator) or needs_critic(a.estimator):
        raise ValueError(f"{name}: estimator {a.estimator!r} needs more than the saved samples (a greedy rollout or "
                         "the critic's values); accepted: estimators with a group or batch baseline")  # fmt: skip
    if a.overlong_buffer or a.reward_kl_coef:
        raise ValueError(f"{name}: algorithm.overlong_buffer={a.overlong_buffer}, reward_kl_coef={a.reward_kl_coef} "
                         "shape the rewards after the samples were saved; accepted: both 0")  # fmt: skip


def _mean(x: np.ndarray) -> float | None:
    return float(x.mean()) if x.size else None


def _corr(x: np.ndarray, y: np.ndarray) -> float | None:
    if x.size < 2 or not x.std() or not y.std():
        return None
    return float(np.corrcoef(x, y)[0, 1])


def overlap(batches: Sequence[Sequence[Sample]], algorithms: dict[str, Any], *, env_step: str | None = None) -> dict[str, Any]:
    """Advantages of each algorithm on every batch, compared (module docstring); the first algorithm is the reference.

    Args:
        batches: one list of samples per training iteration (advantages are computed per batch, as in training).
        algorithms: name -> the ``algorithm`` section of a training config (``estimator``, ``grouping``, ...).
        env_step: the env's ``metadata["reference_env_step"]``; required by GiGPO with ``gamma`` < 1.

    Returns:
        ``calls``, ``outcome_flat_share``, ``reference``, ``env_step`` and per name ``estimator``, ``grouping`` (the
        one used), ``outcome_flat`` (``nonzero_share``, ``mean_abs``) and ``outcome_varied`` (``mean_abs``, and for
        the others ``corr_with_reference``, ``opposite_sign``, ``rms_ratio`` per agent).

    Raises:
        ValueError: no samples; an algorithm :func:`check_evaluable` refuses; GiGPO with ``gamma`` < 1 and no
            ``env_step``.
    """
    names = list(algorithms)
    for name, a in algorithms.items():
        check_evaluable(name, a)
        if needs_env_step(a) and env_step not in ENV_STEPS:
            raise ValueError(f"{name}: gigpo with gamma={a.gamma} discounts over env steps, which the samples do not "
                             f"define: give the env's step (--env-step; accepted: {', '.join(ENV_STEPS)})")  # fmt: skip
    adv: dict[str, list[np.ndarray]] = defaultdict(list)
    flat, agents = [], []
    for samples in batches:
        if not samples:
            continue
        flat.append(outcome_flat(samples))
        agents.append(np.array([s.agent_id for s in samples]))
        for name in names:
            kw = {"env_step": env_step} if needs_env_step(algorithms[name]) else {}
            adv[name].append(np.asarray(sample_advantages(samples, algorithms[name], **kw), dtype=np.float64))
    if not flat:
        raise ValueError("no samples to compare")
    is_flat, agent = np.concatenate(flat), np.concatenate(agents)
    a = {name: np.concatenate(adv[name]) for name in names}
    ref, varied = a[names[0]], ~is_flat
    out: dict[str, Any] = {"calls": int(is_flat.size), "outcome_flat_share": float(is_flat.mean()), "reference": names[0],
                           "env_step": env_step, "presets": {}}  # fmt: skip
    for name in names:
        x, alg = a[name], algorithms[name]
        row: dict[str, Any] = {
            "estimator": alg.estimator, "grouping": effective_grouping(alg.estimator, alg.grouping),
            "outcome_flat": {"nonzero_share": _mean(np.abs(x[is_flat]) > NONZERO), "mean_abs": _mean(np.abs(x[is_flat]))},
            "outcome_varied": {"mean_abs": _mean(np.abs(x[varied]))},
        }  # fmt: skip
        if name != names[0]:
            v = row["outcome_varied"]
            v["corr_with_reference"] = _corr(x[varied], ref[varied])
            v["opposite_sign"] = int((np.sign(x[varied]) * np.sign(ref[varied]) < 0).sum())
            v["rms_ratio"] = {}
            for g in sorted(set(agent[varied])):
                m = varied & (agent == g)
                ref_ms = float(np.mean(ref[m] ** 2))
                v["rms_ratio"][str(g)] = float(np.sqrt(np.mean(x[m] ** 2) / ref_ms)) if ref_ms > 0 else None
        out["presets"][name] = row
    return out


def run_batches(run_dir: str | Path) -> dict[int, list[Sample]]:
    """The saved batches of one run by iteration, in iteration order (``samples/iter_<i>.jsonl`` or ``.parquet``).

    Raises:
        FileNotFoundError: the run has no saved samples (trained without ``run.save_samples``).
    """
    files = sorted([*Path(run_dir).glob("samples/iter_*.jsonl"), *Path(run_dir).glob("samples/iter_*.parquet")])
    if not files:
        raise FileNotFoundError(f"{run_dir}: no samples/iter_*.jsonl or .parquet (the run must be trained with "
                                "run.save_samples=true)")  # fmt: skip
    return {int(f.stem.split("_")[-1]): load_samples(f) for f in files}


def run_env_step(run_dir: str | Path) -> str:
    """The env step of a run's env (``metadata["reference_env_step"]``, default ``"round"``), from its ``config.yaml``.

    Raises:
        FileNotFoundError: the run has no ``config.yaml``.
    """
    import drmas_envs

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: no config.yaml to read the env from; give --env-step")
    env = drmas_envs.make(from_yaml(path.read_text()).env.id)
    return env.metadata.get("reference_env_step", "round")


def training_deviation(run_dir: str | Path, env_step: str | None = None,
                       batches: dict[int, list[Sample]] | None = None) -> float | None:
    """How far the advantages recomputed here under the run's own ``algorithm`` are from what its training logged:
    the largest absolute difference, over iterations and agents, between each agent's mean and std of the recomputed
    advantages and the run's ``adv/<agent>/mean`` and ``adv/<agent>/std`` (``metrics.jsonl``). 0 up to rounding when
    the offline computation is the training's; None when the run's algorithm is not evaluable here
    (:func:`check_evaluable`) or it has no ``config.yaml`` / ``metrics.jsonl``.

    Args:
        env_step: GiGPO's env step; default: the run's env's (:func:`run_env_step`).
        batches: the run's :func:`run_batches`, when already read.

    Raises:
        FileNotFoundError: the run has no saved samples.
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file() or not (run_dir / "metrics.jsonl").is_file():
        return None
    algorithm = from_yaml((run_dir / "config.yaml").read_text()).algorithm
    try:
        check_evaluable("run", algorithm)
    except ValueError:
        return None
    kw = {"env_step": env_step or run_env_step(run_dir)} if needs_env_step(algorithm) else {}
    rows = {row.get("iteration"): row for row in read_metrics(run_dir / "metrics.jsonl")}
    worst = 0.0
    for iteration, samples in (run_batches(run_dir) if batches is None else batches).items():
        adv = np.asarray(sample_advantages(samples, algorithm, **kw), dtype=np.float64)
        agent = np.array([s.agent_id for s in samples])
        for g in sorted(set(agent)):
            for stat, fn in (("mean", np.mean), ("std", np.std)):
                logged = rows.get(iteration, {}).get(f"adv/{g}/{stat}")
                if logged is None:
                    return None
                worst = max(worst, abs(float(fn(adv[agent == g])) - logged))
    return worst


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run directories with saved samples (their batches are pooled; existing "
                   "paths that are not directories, such as the runs' logs a shell glob matches, are skipped)")
    p.add_argument("--presets", nargs="+", default=list(DEFAULT_PRESETS),
                   help=f"presets whose algorithm section is applied; the first is the reference (default {list(DEFAULT_PRESETS)})")  # fmt: skip
    p.add_argument("--env-step", choices=ENV_STEPS, default=None,
                   help="GiGPO's env step (default: read from the env of each run's config.yaml)")
    args = p.parse_args(argv)
    try:
        missing = [r for r in args.runs if not Path(r).exists()]
        if missing:
            raise FileNotFoundError(f"no such run directory: {', '.join(missing)}")
        runs = [r for r in args.runs if Path(r).is_dir()]
        if not runs:
            raise FileNotFoundError(f"none of {args.runs} is a directory")
        algorithms = {name: load_config(name).algorithm for name in args.presets}
        per_run = {r: run_batches(r) for r in runs}
        batches = [b for by_iteration in per_run.values() for b in by_iteration.values()]
        env_step = args.env_step
        if env_step is None and any(needs_env_step(a) for a in algorithms.values()):
            steps = {run_env_step(r) for r in runs}
            if len(steps) > 1:
                raise ValueError(f"the runs' envs have different env steps ({sorted(steps)}): compare one env at a time")
            env_step = steps.pop()
        result = overlap(batches, algorithms, env_step=env_step)
        checks = {r: training_deviation(r, args.env_step, per_run[r]) for r in runs}
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps({"runs": runs, "training_deviation": checks, **result}, indent=2, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
