"""GRPO vs Dr. MAS on CPU: the same multi-agent training run per estimator, comparing per-model gradient norms.

The experiment (``docs/stability.md`` explains it and quotes the measured numbers):

* **Env** (:class:`TargetVerdictEnv`, id ``stability-target-verdict-v0``, registered by this script only). Two agents
  with *strongly different per-call reward distributions*, the setting of Dr. MAS Proposition 4.3
  (arXiv 2602.08847): the **solver** makes ``solver_calls`` attempts per episode at a *hard task* (its text must
  contain the target digit ``9``; ~1.6 % of random-init tiny-llama calls of 8 tokens do), the **verifier** makes
  one call whose only requirement is an *easy format* (a verdict word with an ``e`` in it, as in "yes", "correct",
  "incorrect"; ~50 % at init). Each call is judged on its own: a failed call costs the env's ``format_penalty`` (1.0), and
  the shared episode reward is 0. So a call's reward (``score - penalty``, the drmas convention) is 0 or -1: per
  agent a Bernoulli, exactly Proposition 4.3's model, with sample shares 3/4 (solver) and 1/4 (verifier). At init
  (success ~0.02 vs ~0.5) the predicted global-normalisation factors are ~0.28 (solver) and ~3.2 (verifier): the
  minority agent whose rewards sit far from the pooled mean is the one global normalisation inflates.
* **Models**: two separate ``tiny-llama`` models (random init, same seed; Dr. MAS "non-sharing"), one per agent,
  so each model's pre-clip gradient norm is one agent's. tiny-llama's 384-token byte-level vocabulary keeps the
  event rates above in a learnable range (with Qwen3's 151k-token vocabulary any given digit token is ~1e-5 per
  sampled token) and its forward pass is cheap enough for CPU.
* **Arms**: the library's trainer (:func:`drmas_train.run.trainer.train`) run once per estimator with identical seeds
  (same init, same task order, same sampling seeds: iteration 1 sees identical rollouts), differing only in
  ``algorithm.estimator``. Default arms: ``grpo`` (the paper's baseline: trajectory-averaged scores normalised per
  prompt group), ``drmas`` (agent-wise) and ``grpo_step`` (per-call global normalisation, Proposition 4.3's exact
  setting); ``--estimators grpo drmas`` runs only the two the issue names.
* **Measured**: every iteration's pre-clip grad norm per model (one optimizer step per iteration, so the trainer's
  ``loss/<model>/grad_norm`` is that step's norm), per-agent reward, valid-action rate and measured advantage
  second moment ``E_k[A^2] = adv std^2 + adv mean^2`` beside the Proposition 4.3 prediction from the batch's
  own shares and success rates. Spikes: a norm above ``spike_ratio`` (5) times the running median of that
  model's earlier norms (from the 6th step on; steps whose running median is 0 are not counted).

Run (9 min 49 s for the three default arms on 2 busy CPU cores). It writes ``summary.json``, ``stability.png``
and one run dir per arm (the trainer's ``metrics.jsonl``) under ``--out``; the second command is the 0.9/0.1
share variant quoted in the docs (7 min 50 s)::

    nice python benchmarks/stability/run.py --out runs/stability
    nice python benchmarks/stability/run.py --solver-calls 9 --iterations 60 --out runs/stability_share10
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from drmas_envs.core import ListTaskSource, Outcome, Task, TextAECEnv, Turn

__all__ = [
    "ENV_ID",
    "TargetVerdictEnv",
    "register_env",
    "arm_config",
    "spike_stats",
    "predicted_factors",
    "summarize_arm",
    "plot_arms",
    "main",
]

ENV_ID = "stability-target-verdict-v0"
AGENTS = ("solver", "verifier")


class TargetVerdictEnv(TextAECEnv):
    """Two-agent toy with Bernoulli per-call rewards: a hard task for the solver, an easy format for the verifier.

    ============  =======================================================================================
    agents        ``solver`` (``solver_calls`` attempts, in a row), then ``verifier`` (one call)
    observation   chat messages: the task ("write the digit 7"), the attempt number / the solver's last text
    action        any text
    solver call   valid iff the text contains ``target`` (the task; hard)
    verifier call valid iff the text contains ``verdict_letter`` (``e``: "yes", "correct"; the format; easy)
    reward        episode reward 0 for all; each invalid call costs ``format_penalty`` -> per call 0 or -penalty
    won           some solver attempt was valid
    ============  =======================================================================================

    Args:
        n_tasks: number of (equally hard) tasks; they differ only in their id/prompt text.
        target: the string the solver must produce. solver_calls: solver attempts per episode (>= 1).
        verdict_letter: the string a valid verifier text contains.
        format_penalty: cost of a failed call (> 0). render_mode: as :class:`TextAECEnv`.

    Raises:
        ValueError: ``n_tasks`` or ``solver_calls`` < 1, an empty ``target`` / ``verdict_letter``, or
            ``format_penalty`` <= 0.
    """

    possible_agents = list(AGENTS)
    metadata = {**TextAECEnv.metadata, "name": "stability_target_verdict"}

    def __init__(
        self,
        n_tasks: int = 16,
        target: str = "9",
        solver_calls: int = 3,
        verdict_letter: str = "e",
        format_penalty: float = 1.0,
        render_mode: str | None = None,
    ) -> None:
        if n_tasks < 1 or solver_calls < 1:
            raise ValueError(f"n_tasks and solver_calls must be >= 1, got {n_tasks} and {solver_calls}")
        if not target or not verdict_letter:
            raise ValueError(
                f"target and verdict_letter must be non-empty strings, got {target!r}, {verdict_letter!r}"
            )
        if not format_penalty > 0:
            raise ValueError(
                f"format_penalty must be > 0 (it is the only reward signal), got {format_penalty!r}"
            )
        tasks = ListTaskSource(
            [
                Task(f"target-{i}", "stability", f"Task {i}: write the digit {target}.", target)
                for i in range(n_tasks)
            ]
        )
        super().__init__(tasks, format_penalty=format_penalty, render_mode=render_mode)
        self.solver_calls = int(solver_calls)
        self.verdict_letter = verdict_letter

    def _start_episode(self) -> str:
        self._attempts = 0
        self._hits = 0
        self._last = ""
        return "solver"

    def _prompt(self, agent: str) -> tuple[str, str]:
        if agent == "solver":
            return (
                "You are the solver.",
                f"{self.task.question}\nattempt {self._attempts + 1} of {self.solver_calls}",
            )
        return (
            "You are the verifier. Give a one-word verdict.",
            f"{self.task.question}\nsolver: {self._last[:64]}",
        )

    def _act(self, agent: str, text: str) -> Turn:
        if agent == "solver":
            self._attempts += 1
            self._last = text
            hit = str(self.task.answer) in text
            self._hits += hit
            nxt = "solver" if self._attempts < self.solver_calls else "verifier"
            return Turn(valid=hit, next_agent=nxt)
        return Turn(valid=self.verdict_letter in text, next_agent=None)

    def _episode_outcome(self) -> Outcome:
        return Outcome(0.0, self._hits > 0, {"solver_hits": self._hits})


def register_env() -> None:
    """Register :class:`TargetVerdictEnv` as :data:`ENV_ID` (idempotent)."""
    import drmas_envs

    if ENV_ID not in drmas_envs.registry:
        drmas_envs.register(ENV_ID, TargetVerdictEnv)


def arm_config(estimator: str, args: argparse.Namespace, run_dir: Path) -> Any:
    """The :class:`~drmas_train.run.config.TrainConfig` of one arm; arms differ only in ``algorithm.estimator``.

    Raises:
        ConfigError: an invalid value (e.g. an unknown estimator), before any model loads.
    """
    from drmas_train.run.config import (
        AlgorithmConfig,
        EnvConfig,
        ModelConfig,
        OptimConfig,
        RolloutConfig,
        RunConfig,
        TrainConfig,
        validate_config,
    )

    cfg = TrainConfig(
        seed=args.seed,
        run=RunConfig(
            iterations=args.iterations,
            dir=str(run_dir),
            num_threads=args.threads,
            progress=False,
            tensorboard=False,
            plot=False,
            keep_checkpoints=1,
        ),  # fmt: skip
        env=EnvConfig(
            id=ENV_ID, data="", kwargs={"solver_calls": args.solver_calls, "format_penalty": args.penalty}
        ),
        models={f"{a}_model": ModelConfig(name_or_path=args.model) for a in AGENTS},  # non-sharing
        agents={a: f"{a}_model" for a in AGENTS},
        rollout=RolloutConfig(
            batch_size=args.batch_size,
            group_size=args.group_size,
            temperature=1.0,
            max_new_tokens=args.max_new_tokens,
            max_prompt_tokens=256,
        ),  # fmt: skip
        algorithm=AlgorithmConfig(estimator=estimator),
        optim=OptimConfig(lr=args.lr),
    )
    validate_config(cfg, list(AGENTS))
    return cfg


def spike_stats(norms: Sequence[float], *, ratio: float = 5.0, min_history: int = 5) -> dict[str, Any]:
    """Spikes of one model's per-step gradient norms.

    A step t is a spike when ``norms[t] > ratio * median(norms[:t])``, judged from step ``min_history`` on and
    only where that running median is > 0. Non-finite norms (skipped steps) are counted apart and left out.

    Args:
        norms: (S,) pre-clip L2 norms in step order.

    Returns:
        ``spikes`` (count), ``spike_steps`` (0-based indices), ``median``, ``max``, ``max_over_median``,
        ``zero_steps`` (norm exactly 0: no learning signal), ``nonfinite_steps``.

    Raises:
        ValueError: ``ratio`` <= 1 or ``min_history`` < 1.
    """
    if not ratio > 1 or min_history < 1:
        raise ValueError(f"need ratio > 1 and min_history >= 1, got {ratio} and {min_history}")
    x = np.asarray(norms, dtype=np.float64)
    finite = np.isfinite(x)
    good = x[finite]
    steps = []
    for t in range(len(x)):
        hist = x[:t][finite[:t]]
        if finite[t] and len(hist) >= min_history:
            med = float(np.median(hist))
            if med > 0 and x[t] > ratio * med:
                steps.append(t)
    med = float(np.median(good)) if good.size else math.nan
    mx = float(good.max()) if good.size else math.nan
    return {
        "spikes": len(steps),
        "spike_steps": steps,
        "median": med,
        "max": mx,
        "max_over_median": mx / med if med > 0 else math.inf,
        "zero_steps": int((good == 0).sum()),
        "nonfinite_steps": int((~finite).sum()),
    }


def _closed_form():
    """:func:`closed_form_factors` from the sibling ``theory.py`` (loaded by path: ``benchmarks`` is no package)."""
    spec = importlib.util.spec_from_file_location("stability_theory", Path(__file__).with_name("theory.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.closed_form_factors


def predicted_factors(row: dict[str, Any], penalty: float) -> dict[str, float] | None:
    """Proposition 4.3 factors from one metrics row: shares from ``calls_per_traj``, success rates from the
    reward means (a call's reward is 0 or ``-penalty``, so success = 1 + mean / penalty).

    Returns:
        ``agent -> factor``, or None when the pooled reward has no variance (all succeed or all fail).
    """
    calls = np.array([row[f"reward/{a}/calls_per_traj"] for a in AGENTS], dtype=np.float64)
    success = np.clip(np.array([1.0 + row[f"reward/{a}/mean"] / penalty for a in AGENTS]), 0.0, 1.0)
    shares = calls / calls.sum()
    mu = float(shares @ success)
    if mu * (1 - mu) <= 1e-12:
        return None
    return dict(zip(AGENTS, (float(f) for f in _closed_form()(shares, success)), strict=True))


def summarize_arm(
    rows: list[dict[str, Any]], *, penalty: float, ratio: float, last: int = 10
) -> dict[str, Any]:
    """Per-model spike statistics and per-agent rewards / valid rates / advantage moments of one arm.

    Args:
        rows: the arm's ``metrics.jsonl`` rows in iteration order. last: iterations averaged for "final" values.
    """
    out: dict[str, Any] = {"iterations": len(rows), "models": {}, "agents": {}}
    for a in AGENTS:
        norms = [r.get(f"loss/{a}_model/grad_norm") for r in rows]
        norms = [math.nan if v is None else float(v) for v in norms]
        out["models"][f"{a}_model"] = {"grad_norms": norms, **spike_stats(norms, ratio=ratio)}
    pred = [predicted_factors(r, penalty) for r in rows]
    for a in AGENTS:
        rew = np.array([r[f"reward/{a}/mean"] for r in rows])
        valid = np.array([r[f"reward/{a}/valid_action_ratio"] for r in rows])
        a2 = np.array(
            [r[f"adv/{a}/std"] ** 2 + r[f"adv/{a}/mean"] ** 2 for r in rows]
        )  # E_k[A^2] per iteration
        p = np.array([np.nan if f is None else f[a] for f in pred])
        out["agents"][a] = {
            "reward": rew.tolist(),
            "valid_rate": valid.tolist(),
            "adv_second_moment": a2.tolist(),
            "prop43_predicted": p.tolist(),
            "final_reward": float(rew[-last:].mean()),
            "final_valid_rate": float(valid[-last:].mean()),
            "first_valid_rate": float(valid[0]),
            "mean_adv_second_moment": float(a2.mean()),
            "mean_prop43_predicted": float(np.nanmean(p)) if np.isfinite(p).any() else math.nan,
            "zero_std_group_share": float(np.mean([r[f"adv/{a}/zero_std_group_share"] for r in rows])),
        }
    out["iteration_s"] = float(np.mean([r.get("perf/iteration_s", math.nan) for r in rows]))
    return out


def plot_arms(arms: dict[str, dict[str, Any]], out_png: Path, *, ratio: float) -> Path:
    """PNG: per agent/model (columns), grad norm with spikes marked, valid-action rate, E_k[A^2] (rows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 2, figsize=(12, 10), sharex=True)
    colors = dict(zip(arms, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for col, a in enumerate(AGENTS):
        for name, res in arms.items():
            m = res["models"][f"{a}_model"]
            ag = res["agents"][a]
            it = np.arange(1, len(m["grad_norms"]) + 1)
            norms = np.asarray(m["grad_norms"])
            axes[0, col].plot(it, norms, color=colors[name], label=f"{name} ({m['spikes']} spikes)")
            if m["spike_steps"]:
                s = np.asarray(m["spike_steps"])
                axes[0, col].scatter(s + 1, norms[s], color=colors[name], marker="x", s=60, zorder=3)
            axes[1, col].plot(it, ag["valid_rate"], color=colors[name], label=name)
            axes[2, col].plot(it, ag["adv_second_moment"], color=colors[name], label=f"{name} measured")
        ref = "grpo_step" if "grpo_step" in arms else next(iter(arms))  # predicted for its own batches
        axes[2, col].plot(it, arms[ref]["agents"][a]["prop43_predicted"], color="k", ls="--", lw=1,
                          label=f"Prop. 4.3 global factor (from {ref} batches)")  # fmt: skip
        axes[0, col].set(title=f"{a} model: pre-clip grad norm (x = >{ratio:g}x running median)")
        axes[0, col].set_yscale("symlog", linthresh=0.1)  # linear below 0.1: zero norms stay visible
        axes[1, col].set(title=f"{a}: valid-action rate", ylim=(-0.02, 1.02))
        axes[2, col].set(title=f"{a}: advantage second moment E[A^2]", xlabel="iteration")
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle("GRPO vs Dr. MAS, identical seeds (stability-target-verdict-v0, 2x tiny-llama, non-sharing)")
    fig.tight_layout()
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: train one arm per estimator, then write ``summary.json`` and ``stability.png`` into ``--out``."""
    ap = argparse.ArgumentParser(description="GRPO vs Dr. MAS gradient-norm stability run (CPU)")
    ap.add_argument(
        "--estimators", nargs="+", default=["grpo", "drmas", "grpo_step"], help="one run per estimator"
    )
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=4, help="N tasks per iteration")
    ap.add_argument("--group-size", type=int, default=8, help="G rollouts per task")
    ap.add_argument("--solver-calls", type=int, default=3, help="solver attempts per episode (verifier: 1)")
    ap.add_argument("--penalty", type=float, default=1.0, help="cost of a failed call")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--model", default="tiny-llama", help="named model for both agents (separate copies)")
    ap.add_argument(
        "--lr", type=float, default=1e-3, help="AdamW lr (tiny random-init models need a large one)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--spike-ratio", type=float, default=5.0)
    ap.add_argument(
        "--out", default="runs/stability", help="output dir (summary.json, stability.png, <arm>/)"
    )
    args = ap.parse_args(argv)

    import torch

    from drmas_train.run.metrics_log import read_metrics
    from drmas_train.run.trainer import train

    torch.set_num_threads(args.threads)
    register_env()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    configs = {e: arm_config(e, args, out / e) for e in args.estimators}  # all validated before any training
    arms: dict[str, dict[str, Any]] = {}
    for estimator, cfg in configs.items():
        metrics = Path(cfg.run.dir) / "metrics.jsonl"
        if metrics.exists():
            metrics.unlink()  # a fresh run, not an append to an older one
        t0 = time.perf_counter()
        train(cfg)
        arms[estimator] = summarize_arm(read_metrics(metrics), penalty=args.penalty, ratio=args.spike_ratio)
        arms[estimator]["wall_s"] = round(time.perf_counter() - t0, 1)
        print(f"[{estimator}] done in {arms[estimator]['wall_s']} s", file=sys.stderr)
    png = plot_arms(arms, out / "stability.png", ratio=args.spike_ratio)
    compact = {
        e: {
            "wall_s": r["wall_s"],
            "models": {m: {k: v for k, v in s.items() if k != "grad_norms"} for m, s in r["models"].items()},
            "agents": {
                a: {k: v for k, v in s.items() if not isinstance(v, list)} for a, s in r["agents"].items()
            },
        }
        for e, r in arms.items()
    }
    summary = {"config": {k: v for k, v in vars(args).items()}, "env": ENV_ID, "plot": str(png), "arms": compact,
               "series": arms}  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    print(json.dumps({"config": summary["config"], "arms": compact}, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
