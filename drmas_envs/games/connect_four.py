r"""# Connect four (``openspiel/connect_four-v0``): OpenSpiel's ``connect_four`` as a text env

| | |
|---|---|
| Create | ``drmas_envs.make("openspiel/connect_four-v0", opponent=None, opponent_seat="random", invalid_action="random")`` |
| Agents | ``["player_0", "player_1"]`` (player 0 plays ``x`` and moves first, player 1 plays ``o``) |
| Turn order | alternating, 7 to 42 calls in self-play (with an opponent only the learner's seat calls) |
| Action | free text; the move is the last ``<action>NAME</action>``, NAME like ``x3`` (mark, column 0-6) |
| Observation | ``{"prompt", "messages"}``: rules, OpenSpiel's observation string (the board), legal action names |
| Fixed opponents | ``random-v0``, ``mcts-v0`` (:mod:`drmas_envs.games.opponents`) |

A 6-row, 7-column board; a move drops a mark into a column, where it falls to the lowest empty cell. The observation
string is the board with the bottom row last, ``.`` empty. Perfect information; the first player wins under optimal
play.

## Rewards

Each seat receives its own return (``state.returns()``), zero-sum; each invalid call costs its agent
``format_penalty`` (0.1).

| Event | winner | loser |
|---|---|---|
| four in a row (horizontal, vertical or diagonal) | +1 | -1 |
| full board, no line (draw) | 0 | 0 |
| ``invalid_action="forfeit"``: an invalid reply | +1 (``max_utility``) | -1 (``min_utility``) |

``EpisodeRecord.agent_rewards`` holds each seat's return; ``reward`` / ``won`` are the first learning seat's
(with an opponent, the learner's; in self-play, ``player_0``'s).

## Termination vs truncation

Episodes always **terminate** (at most 42 moves); never truncated. Infos as :mod:`drmas_envs.games.kuhn_poker`.

## Arguments

See :class:`~drmas_envs.games.openspiel_env.OpenSpielEnv`: ``opponent``, ``opponent_seat``, ``invalid_action``,
``format_penalty`` (0.1), ``system_prompt``, ``render_mode``.

## Version history

* v0 (drmas 0.1.0): initial version (OpenSpiel 2.0.2).
"""

from __future__ import annotations

from drmas_envs.core.factories import make_factories
from drmas_envs.games.openspiel_env import OpenSpielEnv

__all__ = ["raw_env", "env", "parallel_env"]


class raw_env(OpenSpielEnv):  # noqa: N801 - PettingZoo naming convention
    """Connect four (see the module docstring for the card)."""

    GAME = "connect_four"
    TITLE = "connect four"
    RULES = (
        "Rules: a board of 6 rows and 7 columns; player 0 drops x, player 1 drops o, alternately; a mark falls to "
        "the lowest empty cell of its column. Four of your marks in a row (horizontally, vertically or diagonally) "
        "wins; a full board without one is a draw. Your view is the board, bottom row last, '.' empty. An action "
        "x3 drops an x into column 3 (columns 0-6)."
    )
    VIEW = "observation"
    OPPONENTS = ("random-v0", "mcts-v0")
    metadata = {**OpenSpielEnv.metadata, "name": "openspiel_connect_four_v0"}


env, parallel_env = make_factories(raw_env)
