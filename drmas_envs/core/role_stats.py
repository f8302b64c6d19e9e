"""Per-role results of episodes whose agents' rewards differ (games): mean return and win/draw/loss rates, with
standard errors. Pure functions of plain numbers; no torch, no env.

Definitions, for each episode and each *learning* agent ``a`` of it (its ``learners``; every agent when it names
none) with game return ``r_a`` (before format penalties, :meth:`EpisodeRecord.reward_of`) and the other agents'
returns ``r_o``:

* **win** when ``r_a > max(r_o)``, **draw** when ``r_a == max(r_o)``, **loss** otherwise (two-player zero-sum:
  the sign of ``r_a``);
* per role (agent id, i.e. seat), over its ``n`` episodes: the mean return and the three rates, each with the
  standard error of a mean over episodes, ``std(values, ddof=1) / sqrt(n)`` (``None`` when ``n < 2``; for a rate,
  the values are the 0/1 indicators), the rule of :mod:`drmas_train.eval.metrics`;
* the role ``"all"`` pools every (episode, learning agent) pair.

Example (two Kuhn poker episodes, the learner in seat 0 then seat 1):

>>> stats = role_outcomes([({"player_0": 1.0, "player_1": -1.0}, ["player_0"]),
...                        ({"player_0": 2.0, "player_1": -2.0}, ["player_1"])])
>>> stats["player_0"].win_rate, stats["player_1"].loss_rate, stats["all"].mean_return
(1.0, 1.0, -0.5)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from drmas_envs.core.episode import EpisodeRecord

__all__ = ["RoleStats", "ALL_ROLES", "outcome", "role_outcomes", "role_stats"]

#: The key of the row pooling every role.
ALL_ROLES = "all"


@dataclasses.dataclass(frozen=True)
class RoleStats:
    """One role's results over ``episodes`` episodes (rates in [0, 1], returns in the game's units).

    Attributes:
        role: the agent id (seat), or :data:`ALL_ROLES`.
        episodes: episodes the role was a learner in.
        mean_return, return_se: mean game return and its standard error (``None`` when ``episodes < 2``).
        win_rate, draw_rate, loss_rate: shares of wins, draws and losses (they sum to 1).
        win_se, draw_se, loss_se: their standard errors (``None`` when ``episodes < 2``).
    """

    role: str
    episodes: int
    mean_return: float
    return_se: float | None
    win_rate: float
    draw_rate: float
    loss_rate: float
    win_se: float | None
    draw_se: float | None
    loss_se: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field."""
        return dataclasses.asdict(self)


def outcome(agent: str, rewards: Mapping[str, float]) -> str:
    """``"win"``, ``"draw"`` or ``"loss"`` of ``agent`` given every agent's game return ``rewards``.

    Raises:
        ValueError: ``agent`` is not in ``rewards``, or it is the only agent (no one to compare with).
    """
    if agent not in rewards:
        raise ValueError(f"agent {agent!r} has no reward; rewards are given for {sorted(rewards)}")
    others = [float(r) for a, r in rewards.items() if a != agent]
    if not others:
        raise ValueError(f"win/draw/loss needs at least two agents, got only {agent!r}")
    mine, best = float(rewards[agent]), max(others)
    return "win" if mine > best else "draw" if mine == best else "loss"


def _mean_se(values: Sequence[float]) -> tuple[float, float | None]:
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, None
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def _stats(role: str, returns: list[float], results: list[str]) -> RoleStats:
    mean_return, return_se = _mean_se(returns)
    rates = {k: _mean_se([float(r == k) for r in results]) for k in ("win", "draw", "loss")}
    return RoleStats(
        role, len(returns), mean_return, return_se,
        rates["win"][0], rates["draw"][0], rates["loss"][0], rates["win"][1], rates["draw"][1], rates["loss"][1],
    )  # fmt: skip


def role_outcomes(episodes: Iterable[tuple[Mapping[str, float], Sequence[str] | None]]) -> dict[str, RoleStats]:
    """Per-role :class:`RoleStats` of ``(agent game returns, learning agents or None)`` pairs, one per episode.

    Returns:
        ``{role: RoleStats}``, roles sorted, plus :data:`ALL_ROLES` last.

    Raises:
        ValueError: no episodes, an episode without returns, or a learner without a return (see :func:`outcome`).
    """
    returns: dict[str, list[float]] = {}
    results: dict[str, list[str]] = {}
    for i, (rewards, learners) in enumerate(episodes):
        if not rewards:
            raise ValueError(f"episode {i} has no per-agent returns: not a game episode (EpisodeRecord.agent_rewards)")
        for agent in learners if learners else sorted(rewards):
            result = outcome(agent, rewards)
            returns.setdefault(agent, []).append(float(rewards[agent]))
            results.setdefault(agent, []).append(result)
    if not returns:
        raise ValueError("no episodes to evaluate: give at least one")
    out = {role: _stats(role, returns[role], results[role]) for role in sorted(returns)}
    out[ALL_ROLES] = _stats(
        ALL_ROLES, [r for role in sorted(returns) for r in returns[role]],
        [r for role in sorted(results) for r in results[role]],
    )  # fmt: skip
    return out


def role_stats(records: Iterable[EpisodeRecord]) -> dict[str, RoleStats]:
    """Per-role :class:`RoleStats` of game episodes (``agent_rewards`` set), for the learners of each episode.

    The learners are the record's ``metrics["learners"]`` (the agents of the AEC loop; the fixed opponent's seat
    is not one), else every agent. Evaluate one fixed opponent at a time.

    Raises:
        ValueError: the records mix opponents (``metrics["opponent"]``), plus :func:`role_outcomes`' errors.
    """
    records = list(records)
    opponents = sorted({str(r.metrics.get("opponent")) for r in records})
    if len(opponents) > 1:
        raise ValueError(f"the records mix opponents {opponents}; evaluate each opponent's records separately")
    return role_outcomes((dict(r.agent_rewards), r.metrics.get("learners")) for r in records)
