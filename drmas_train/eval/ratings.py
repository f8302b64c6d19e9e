"""Ratings of checkpoints from cross-play games: openskill's Weng-Lin Plackett-Luce model, one rating per player.

A cross-play grid of a game (``drmas crossplay`` on a run trained on :mod:`drmas_envs.games`) pits one seat's
players (checkpoints) against another's. Every episode is a two-player match: the row player, in the row role's
seat, against the column player; the one whose game return is strictly larger wins, equal returns draw
(:func:`drmas_envs.core.role_stats.outcome`). The matches update one rating per player with
`openskill <https://openskill.me>`_'s ``PlackettLuce`` model (Weng & Lin, "A Bayesian Approximation Method for
Online Ranking", JMLR 12, 2011): each player's skill is a normal ``N(mu, sigma^2)`` (start ``mu = 25``,
``sigma = 25/3``), and players are ranked by the conservative ``ordinal = mu - 3 sigma``. A player met in both
seats (a shared model's checkpoint) is one player. A match of a player against itself is skipped (no
information), and so is every match of a grid whose episodes carry no per-seat returns (not a game).

Online ratings depend on the order of the matches; the order here is fixed and interleaved (hand 1 of every cell,
cells row by row, then hand 2, ...), so a grid's ratings are reproducible and no cell's games all come last. Beside the rating each player gets its own results over its matches:
win/draw/loss rates and mean game return, with standard errors over matches (the avg@k of the player: its share of
wins, as ``won`` counts them).
"""

from __future__ import annotations

import dataclasses
import html
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from drmas_envs.core.role_stats import outcome
from drmas_train.eval.metrics import mean_stderr

__all__ = ["Match", "PlayerRating", "rate_matches", "crossplay_matches", "ratings_markdown", "ratings_html"]

#: result of a match for its first player
_SCORE = {"win": 1.0, "draw": 0.5, "loss": 0.0}


@dataclasses.dataclass(frozen=True)
class Match:
    """One game between two players: ``a``'s result (``"win"``, ``"draw"`` or ``"loss"``) and each one's return."""

    a: str
    b: str
    result: str
    return_a: float
    return_b: float


@dataclasses.dataclass(frozen=True)
class PlayerRating:
    """One player's rating and results over its matches.

    Attributes:
        player: its name. rank: 1-based, by ``ordinal`` (ties share a rank).
        mu, sigma: the skill's mean and standard deviation (openskill units, start 25 and 25/3).
        ordinal: ``mu - 3 sigma``, the ranking key.
        matches: matches played (self-matches excluded).
        win, draw, loss: rates in [0, 1]; ``win_se``, ... their standard errors over matches (None below 2).
        mean_return, return_se: its mean game return and standard error.
    """

    player: str
    rank: int
    mu: float
    sigma: float
    ordinal: float
    matches: int
    win: float
    draw: float
    loss: float
    win_se: float | None
    draw_se: float | None
    loss_se: float | None
    mean_return: float
    return_se: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field."""
        return dataclasses.asdict(self)


def rate_matches(matches: Iterable[Match]) -> list[PlayerRating]:
    """Rate the players of ``matches`` (in the order given) with openskill's Plackett-Luce model.

    Returns:
        one :class:`PlayerRating` per player that played a match against another, best first (by ``ordinal``,
        then name).

    Raises:
        ImportError: openskill is not installed (the message names the extra).
        ValueError: a result other than win/draw/loss.
    """
    try:
        from openskill.models import PlackettLuce
    except ImportError as err:
        raise ImportError("ratings need openskill, in drmas's extra 'games': pip install 'drmas[games]'") from err

    model = PlackettLuce()
    ratings: dict[str, Any] = {}
    results: dict[str, list[tuple[str, float]]] = {}
    for m in matches:
        if m.result not in _SCORE:
            raise ValueError(f"match result must be one of {sorted(_SCORE)}, got {m.result!r}")
        if m.a == m.b:
            continue
        ra = ratings.setdefault(m.a, model.rating(name=m.a))
        rb = ratings.setdefault(m.b, model.rating(name=m.b))
        ranks = {"win": [0, 1], "draw": [0, 0], "loss": [1, 0]}[m.result]  # lower rank = better
        [[ratings[m.a]], [ratings[m.b]]] = model.rate([[ra], [rb]], ranks=ranks)
        other = {"win": "loss", "draw": "draw", "loss": "win"}[m.result]
        results.setdefault(m.a, []).append((m.result, float(m.return_a)))
        results.setdefault(m.b, []).append((other, float(m.return_b)))
    order = sorted(ratings, key=lambda p: (-ratings[p].ordinal(), p))
    out: list[PlayerRating] = []
    for i, p in enumerate(order):
        r = ratings[p]
        rank = out[-1].rank if out and r.ordinal() == out[-1].ordinal else i + 1
        rates = {k: mean_stderr([float(res == k) for res, _ in results[p]]) for k in _SCORE}
        ret = mean_stderr([v for _, v in results[p]])
        out.append(PlayerRating(
            p, rank, float(r.mu), float(r.sigma), float(r.ordinal()), len(results[p]),
            rates["win"].value, rates["draw"].value, rates["loss"].value,
            rates["win"].stderr, rates["draw"].stderr, rates["loss"].stderr, ret.value, ret.stderr,
        ))  # fmt: skip
    return out


def _player_names(matrix: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """Names of the row and column players: one per distinct model (a shared model's checkpoint in both seats is
    one player), its label, made unique with the role whose model it is (or the axis role) when two models share
    a label."""
    axes = [(p, matrix["roles"]["rows"]) for p in matrix["rows"]] + [(p, matrix["roles"]["cols"]) for p in matrix["cols"]]
    key = [json.dumps(p["model"], sort_keys=True, default=str) for p, _ in axes]
    labels: dict[str, set[str]] = {}
    for (p, _), k in zip(axes, key, strict=True):
        labels.setdefault(p["label"], set()).add(k)
    names = []
    for (p, role), _k in zip(axes, key, strict=True):
        whose = p.get("info", {}).get("model_of") or role
        names.append(p["label"] if len(labels[p["label"]]) == 1 else f"{p['label']} ({whose}'s model)")
    n = len(matrix["rows"])
    return names[:n], names[n:]


def crossplay_matches(matrix: Mapping[str, Any], episodes: Sequence[Sequence[Sequence[Mapping[str, Any]]]]) -> list[Match]:
    """The matches of a cross-play grid: cell ``(i, j)``'s episodes are games of row player ``i`` (in the row
    role's seat) against column player ``j``.

    Args:
        matrix: ``crossplay.json``'s object (:func:`drmas_train.eval.crossplay.run_crossplay`).
        episodes: ``episodes[i][j]``: the result rows of cell ``(i, j)`` (``RunResult.episodes``).

    Returns:
        the matches, interleaved: the first hand of every cell (cells row by row), then the second, ..., so that
        no cell's games all come last (an online rating weighs late games more); empty when an episode has no ``agent_rewards`` (not a
        game) or its learners are not both axis roles (a fixed opponent played a seat: not a head-to-head grid;
        cross-play such a run with ``--env-kwarg opponent=null``).
    """
    row_role, col_role = matrix["roles"]["rows"], matrix["roles"]["cols"]
    rows, cols = _player_names(matrix)
    cells = [(i, j, cell) for i, row_cells in enumerate(episodes) for j, cell in enumerate(row_cells)]
    out = []
    for e in range(max((len(cell) for _, _, cell in cells), default=0)):  # interleaved: hand e of every cell
        for i, j, cell in cells:
            if e >= len(cell):
                continue
            rewards = cell[e].get("agent_rewards")
            if not rewards or not {row_role, col_role} <= set(cell[e].get("learners") or rewards):
                return []
            out.append(Match(rows[i], cols[j], outcome(row_role, rewards), float(rewards[row_role]),
                             float(rewards[col_role])))  # fmt: skip
    return out


def _pct(value: float, se: float | None) -> str:
    return f"{100 * value:.1f}" + ("" if se is None else f" ± {100 * se:.1f}")


def _row(r: PlayerRating) -> list[str]:
    ret = f"{r.mean_return:+.3f}" + ("" if r.return_se is None else f" ± {r.return_se:.3f}")
    return [str(r.rank), r.player, f"{r.ordinal:.2f}", f"{r.mu:.2f} ± {r.sigma:.2f}", str(r.matches),
            _pct(r.win, r.win_se), _pct(r.draw, r.draw_se), _pct(r.loss, r.loss_se), ret]  # fmt: skip


_HEAD = ["Rank", "Player", "Rating (μ − 3σ)", "μ ± σ", "Games", "Win % (avg@k)", "Draw %", "Loss %", "Return"]


def ratings_markdown(ratings: Sequence[PlayerRating], title: str = "Ratings from cross-play") -> str:
    """A Markdown section: the players ranked by rating, with their win (avg@k), draw and loss rates and mean
    return ± standard error over their games."""
    lines = [f"## {title} (openskill Plackett-Luce; ± standard error over games)", "",
             "| " + " | ".join(_HEAD) + " |", "|" + "|".join(["---:", "---"] + ["---:"] * (len(_HEAD) - 2)) + "|"]  # fmt: skip
    lines += ["| " + " | ".join(_row(r)) + " |" for r in ratings]
    return "\n".join(lines) + "\n"


def ratings_html(ratings: Sequence[PlayerRating], title: str = "Ratings from cross-play") -> str:
    """The same table as an HTML section."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in _HEAD)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _row(r)) + "</tr>" for r in ratings)
    return f"<h2>{html.escape(title)}</h2><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
