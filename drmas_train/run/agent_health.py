"""Per-agent training health: a warning when one agent's advantage second moment or gradient share runs away.

Every iteration logs, per agent (not only per model):

* from the batch (:func:`drmas_train.run.metrics_log.batch_metrics`): ``adv/<a>/{mean,std,second_moment}``,
  ``adv/<a>/prop43_ratio`` (what one pooled baseline per prompt group would give), ``adv/<a>/zero_adv_group_share``,
  ``reward/<a>/response_length``, ``reward/<a>/format_penalty_rate``;
* from the update (:mod:`drmas_train.algorithm.agent_grads`, :mod:`drmas_train.algorithm.old_logprobs`):
  ``agent/<a>/{grad_norm,grad_norm_max,grad_share,loss_share,grad_ratio}`` and ``agent/<a>/logprob_gap_{mean,max}``;
* from this module: ``health/<a>/adv_moment_vs_others`` and ``health/<a>/grad_vs_model`` (the ratios below) and
  ``health/runaway_agents`` (how many agents are past the threshold now).

Two signals (a ratio of 1 = like the others):

1. **advantage second moment** ``E_k[A^2]`` (``adv/<a>/second_moment``) over the median of the *other* agents' of
   the run. Under one pooled baseline per group it is the Dr. MAS paper's Proposition 4.3 factor
   ``(sigma_k^2 + (mu_k - mu)^2) / sigma^2`` (arXiv 2602.08847, Sec. 4), which ``E||g_k||^2`` follows; agent-wise
   normalisation (Dr. MAS, Eq. 5) holds every agent's near 1;
2. **gradient share per loss share** ``grad_ratio = grad_share / loss_share`` (``agent/<a>/grad_ratio``) of an
   agent of a model that several agents play: the measured counterpart of the same factor (docs/agent-health.md),
   relative to the model's average, which is exactly 1 (``sum_k loss_share_k * grad_ratio_k = sum_k grad_share_k =
   1``). It is *not* divided by the other agents' ratios: with two agents that divides by one number that can be
   near 0 or negative (an agent whose gradient is nearly orthogonal to the total), and the README's own quickstart
   run then read 12.9x at iteration 4 (0.165 for the Solver, 2.13 for the Verifier) although no agent took more than
   2.2x its share. Under per-agent normalisation the first signal is logged but never warns (:func:`find_runaways`).
   Replayed on the committed metrics of that run
   (``benchmarks/learning/data/quickstart_math_seed0_metrics.jsonl``), neither signal reaches the default threshold
   4 (tests/drmas_train/run/test_agent_health.py).

:class:`HealthMonitor` logs one WARNING when an agent's ratio first reaches ``run.health_warn_ratio`` (and again
only after it fell back below): which agent, which signal, by how much, and what to try.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping

import numpy as np

from drmas_train.algorithm.advantages import effective_grouping
from drmas_train.algorithm.grouping import cell

__all__ = ["HealthWarning", "runaway_signals", "find_runaways", "HealthMonitor", "normalised_per_agent"]

logger = logging.getLogger(__name__)

#: signal name -> (metric it reads, what it is called in a warning)
SIGNALS = {
    "adv_moment_vs_others": ("adv/{a}/second_moment", "advantage second moment E[A^2]"),
    "grad_vs_model": ("agent/{a}/grad_ratio", "gradient share per loss share"),
}


@dataclasses.dataclass(frozen=True)
class HealthWarning:
    """One agent past the threshold on one signal.

    Attributes:
        agent: the agent id. signal: ``adv_moment_vs_others`` or ``grad_vs_model``.
        value: ``adv_moment_vs_others``: the agent's ``E[A^2]``; ``grad_vs_model``: its gradient share.
        others: ``adv_moment_vs_others``: the median of the other agents' ``E[A^2]``; ``grad_vs_model``: its loss
            share. ratio: ``value / others``. model: the agent's model id.
    """

    agent: str
    signal: str
    value: float
    others: float
    ratio: float
    model: str

    def message(self, estimator: str, grouping: str | None) -> str:
        """The warning line: which agent, by how much, and what to try (depends on the estimator in use)."""
        what = SIGNALS[self.signal][1]
        if self.signal == "adv_moment_vs_others":
            line = (f"agent {self.agent!r}: {what} is {self.ratio:.1f}x the median of the other agents "
                    f"({self.value:.3g} vs {self.others:.3g})")  # fmt: skip
        else:
            line = (f"agent {self.agent!r}: {what} is {self.ratio:.1f}x the average of model {self.model!r} (its "
                    f"share of the gradient {self.value:.3g} for a share of the loss {self.others:.3g})")  # fmt: skip
        # per-agent baselines: the grouping in use (the estimator's own when unset) keeps agents apart
        per_agent = normalised_per_agent(estimator, grouping)
        if not per_agent:
            return (f"{line}; one baseline shared by agents with different reward distributions inflates this agent's "
                    f"gradients (Dr. MAS Prop. 4.3); try algorithm.estimator=drmas (per-agent normalisation) or "
                    f"algorithm.grouping=prompt_agent")  # fmt: skip
        return (f"{line} although advantages are normalised per agent; try a lower learning rate for its model "
                f"(models.<key>.lr), a model of its own (agents.{self.agent}=<another model key>), or look at its "
                f"response lengths and format penalties (reward/{self.agent}/*)")  # fmt: skip


def _values(metrics: Mapping[str, float], template: str, agents: list[str]) -> dict[str, float]:
    out = {}
    for a in agents:
        v = metrics.get(template.format(a=a))
        if v is not None and math.isfinite(float(v)):
            out[a] = float(v)
    return out


def _versus_others(values: dict[str, float]) -> dict[str, tuple[float, float]]:
    """``agent -> (median of the others, value / that median)`` for agents whose others' median is > 0."""
    out = {}
    for a, v in values.items():
        others = [w for b, w in values.items() if b != a]
        if not others:
            continue
        med = float(np.median(others))
        if med > 1e-12:
            out[a] = (med, v / med)
    return out


def runaway_signals(
    metrics: Mapping[str, float], agent_models: Mapping[str, str]
) -> dict[str, tuple[float, float, float]]:
    """The two signals of every agent: ``"<signal>/<agent>" -> (value, reference, ratio)`` (see
    :class:`HealthWarning` for what value and reference are per signal).

    Args:
        metrics: one iteration's metrics (batch and update). agent_models: ``agent_id -> model_id``.
    """
    agents = sorted(agent_models)
    out: dict[str, tuple[float, float, float]] = {}
    adv = _values(metrics, SIGNALS["adv_moment_vs_others"][0], agents)
    for a, (med, ratio) in _versus_others(adv).items():
        out[f"adv_moment_vs_others/{a}"] = (adv[a], med, ratio)
    for model in sorted(set(agent_models.values())):
        members = [a for a in agents if agent_models[a] == model]
        if len(members) < 2:  # one agent's share is the whole model's: nothing to compare
            continue
        grad = _values(metrics, "agent/{a}/grad_share", members)
        loss = _values(metrics, "agent/{a}/loss_share", members)
        for a in members:
            if a in grad and loss.get(a, 0.0) > 1e-12:
                out[f"grad_vs_model/{a}"] = (grad[a], loss[a], grad[a] / loss[a])
    return out


def normalised_per_agent(estimator: str, grouping: str | None) -> bool:
    """Whether the grouping in use (``algorithm.grouping``, else the estimator's own) normalises advantages per agent
    (:func:`drmas_train.algorithm.grouping.cell`)."""
    g = effective_grouping(estimator, grouping)
    return g is not None and cell(g)[0]


def find_runaways(
    metrics: Mapping[str, float], agent_models: Mapping[str, str], threshold: float, *, per_agent: bool = False
) -> list[HealthWarning]:
    """Agents whose signal is at least ``threshold`` (none when ``threshold`` is 0).

    ``per_agent``: advantages are normalised per agent (:func:`normalised_per_agent`); then the advantage signal
    never warns. Each agent's ``E[A^2]`` is at most 1 by construction (``(n - 1) / n`` in a group whose rewards vary,
    0 in one whose rewards are all equal), so its ratio to another agent's only measures how many of the *other*
    agent's groups had equal rewards: the README quickstart's Solver, right at iteration 4, had ``E[A^2]`` 0.176
    against the Verifier's 0.562 (3.2x). The gradient signal still applies."""
    if threshold <= 0:
        return []
    found = []
    for key, (value, others, ratio) in runaway_signals(metrics, agent_models).items():
        signal, agent = key.split("/", 1)
        if per_agent and signal == "adv_moment_vs_others":
            continue
        if ratio >= threshold:
            found.append(HealthWarning(agent, signal, value, others, ratio, agent_models[agent]))
    return found


class HealthMonitor:
    """Checks every iteration's metrics; warns once per (agent, signal) each time it crosses the threshold.

    Args:
        agent_models: ``agent_id -> model_id``. threshold: ``run.health_warn_ratio`` (0 = never warn).
        estimator, grouping: ``algorithm.estimator`` / ``algorithm.grouping`` (what the warning suggests).
    """

    def __init__(
        self, agent_models: Mapping[str, str], threshold: float, estimator: str, grouping: str | None
    ) -> None:
        self.agent_models = {a: m for a, m in agent_models.items() if a != "*"}
        self.threshold, self.estimator, self.grouping = threshold, estimator, grouping
        self._active: set[tuple[str, str]] = set()

    def check(
        self, iteration: int, metrics: Mapping[str, float]
    ) -> tuple[dict[str, float], list[HealthWarning]]:
        """Returns ``(health metrics, warnings newly raised)``; the new warnings are logged (WARNING)."""
        signals = runaway_signals(metrics, self.agent_models)
        out = {
            f"health/{key.split('/', 1)[1]}/{key.split('/', 1)[0]}": ratio
            for key, (_, _, ratio) in signals.items()
        }
        per_agent = normalised_per_agent(self.estimator, self.grouping)
        runaways = find_runaways(metrics, self.agent_models, self.threshold, per_agent=per_agent)
        now = {(w.agent, w.signal) for w in runaways}
        new = [w for w in runaways if (w.agent, w.signal) not in self._active]
        self._active = now
        out["health/runaway_agents"] = float(len({w.agent for w in runaways}))
        for w in new:
            logger.warning("iter %d: %s", iteration, w.message(self.estimator, self.grouping))
        return out, new
