"""Per-role game results as flat metrics, for training and validation logs (``game/...``, ``val/<opponent>/...``).

A game episode (``EpisodeRecord.agent_rewards`` set: :mod:`drmas_envs.games`) gives each learning seat a return and
a win, draw or loss (:mod:`drmas_envs.core.role_stats` defines them and their standard errors). This module turns
those :class:`~drmas_envs.core.role_stats.RoleStats` into the flat ``name -> float`` rows that ``metrics.jsonl``,
TensorBoard and the trackers take, and computes the paired gain of a validation over an earlier one played on the
same seeds (same deals, same seats).

Metric names, with ``<p>`` the prefix and ``<role>`` a seat (``player_0``, ...) or ``all`` (every learning seat
pooled): ``<p>/<role>/return`` (mean game return, before format penalties), ``<p>/<role>/win``, ``/draw``,
``/loss`` (rates in [0, 1]), each with ``..._se`` (the standard error of the mean over episodes; omitted when a
role has fewer than 2 episodes), and ``<p>/<role>/episodes``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from drmas_envs.core.role_stats import role_outcomes
from drmas_train.eval.metrics import mean_stderr

__all__ = ["episode_returns", "is_game_episode", "paired_gain", "role_metrics", "role_return_gain", "stats_line"]


def is_game_episode(record: Any) -> bool:
    """Whether ``record`` (an :class:`~drmas_envs.core.episode.EpisodeRecord`) holds per-seat returns."""
    return bool(getattr(record, "agent_rewards", None))


def _learners(record: Any) -> list[str]:
    return list(record.metrics.get("learners") or sorted(record.agent_rewards))


def role_metrics(records: Iterable[Any], prefix: str) -> dict[str, float]:
    """Flat per-role metrics of game episodes (see the module docstring for the names).

    Args:
        records: (E,) :class:`~drmas_envs.core.episode.EpisodeRecord` of one opponent (or of self-play), each with
            ``agent_rewards`` and, with a fixed opponent, ``metrics["learners"]``.
        prefix: the names' prefix, e.g. ``"game"`` or ``"val/random-v0"``.

    Returns:
        ``{name: value}``; empty when ``records`` is empty.

    Raises:
        ValueError: a record without per-seat returns (not a game episode).
    """
    pairs = []
    for i, record in enumerate(records):
        if not is_game_episode(record):
            raise ValueError(f"episode {i} has no per-seat returns (EpisodeRecord.agent_rewards): not a game episode")
        pairs.append((dict(record.agent_rewards), _learners(record)))
    if not pairs:
        return {}
    out: dict[str, float] = {}
    for role, st in role_outcomes(pairs).items():
        key = f"{prefix}/{role}"
        out[f"{key}/episodes"] = float(st.episodes)
        for name, value, se in (("return", st.mean_return, st.return_se), ("win", st.win_rate, st.win_se),
                                ("draw", st.draw_rate, st.draw_se), ("loss", st.loss_rate, st.loss_se)):  # fmt: skip
            out[f"{key}/{name}"] = float(value)
            if se is not None:
                out[f"{key}/{name}_se"] = float(se)
    return out


def episode_returns(records: Iterable[Any]) -> list[float]:
    """(E,) each episode's mean game return over its learning seats (one seat with a fixed opponent), in order.

    Raises:
        ValueError: a record without per-seat returns.
    """
    out = []
    for i, record in enumerate(records):
        if not is_game_episode(record):
            raise ValueError(f"episode {i} has no per-seat returns (EpisodeRecord.agent_rewards): not a game episode")
        learners = _learners(record)
        out.append(math.fsum(float(record.agent_rewards[a]) for a in learners) / len(learners))
    return out


def paired_gain(now: Sequence[float], before: Sequence[float]) -> tuple[float, float | None]:
    """Mean and standard error of ``now[i] - before[i]`` over episodes played on the same seeds (paired: the
    deal's and the seat's share of the spread cancels).

    Args:
        now, before: (E,) per-episode returns (:func:`episode_returns`) of two validations with the same seeds.

    Returns:
        ``(mean gain, its standard error)``; the SE is None for fewer than 2 episodes.

    Raises:
        ValueError: the two lists differ in length (not played on the same seeds), or are empty.
    """
    if len(now) != len(before):
        raise ValueError(f"paired gain needs the same episodes: {len(now)} now vs {len(before)} before")
    if not now:
        raise ValueError("paired gain needs at least one episode")
    est = mean_stderr([float(a) - float(b) for a, b in zip(now, before, strict=True)])
    return est.value, est.stderr


def role_return_gain(before: Mapping[str, float], after: Mapping[str, float], prefix: str) -> dict[str, Any]:
    """The return gain of each role between two validations' metrics (:func:`role_metrics` names), and their mean
    with equal weight per role: the game outcome of the normalisation-matrix study
    (``benchmarks/normalisation_matrix/PROTOCOL.md``, "Outcomes": "computed per role and then averaged over the
    roles with equal weight"). With as many episodes per role in both (``opponent_seat: rotate`` over an even
    ``eval.k``) the mean equals the pooled paired gain ``<prefix>/return_gain``; it differs where the seats' shares
    differ.

    Args:
        before, after: ``{name: value}`` rows of two validations, e.g. iteration 0 and the last.
        prefix: the validation's prefix, e.g. ``"val/random-v0"``.

    Returns:
        ``{"gain": mean over roles, "roles": {role: after - before of <prefix>/<role>/return}}``, over the roles
        (not ``all``) with a return in both rows, sorted.

    Raises:
        ValueError: no role has a return in both rows.
    """
    head, tail = f"{prefix}/", "/return"
    roles = sorted(k[len(head):-len(tail)] for k in before if k.startswith(head) and k.endswith(tail)
                   and k.count("/") == head.count("/") + 1 and k != f"{head}all{tail}" and k in after)  # fmt: skip
    if not roles:
        raise ValueError(f"no role has a return ({head}<role>{tail}) in both validations")
    gains = {r: float(after[f"{head}{r}{tail}"]) - float(before[f"{head}{r}{tail}"]) for r in roles}
    return {"gain": math.fsum(gains.values()) / len(gains), "roles": gains}


def stats_line(metrics: Mapping[str, float], prefix: str, role: str = "all") -> str:
    """``return +0.12 ± 0.10, win 55.0% ± 5.0%, draw ..., loss ...`` of one role's metrics (console lines)."""

    def se(name: str, scale: float = 1.0, unit: str = "") -> str:
        value = metrics.get(f"{prefix}/{role}/{name}_se")
        return "" if value is None else f" ± {scale * value:.{1 if unit else 2}f}{unit}"

    ret = metrics[f"{prefix}/{role}/return"]
    parts = [f"return {ret:+.2f}{se('return')}"]
    for name in ("win", "draw", "loss"):
        parts.append(f"{name} {100 * metrics[f'{prefix}/{role}/{name}']:.1f}%{se(name, 100.0, '%')}")
    return ", ".join(parts)
