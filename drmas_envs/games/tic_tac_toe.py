r"""# Tic-tac-toe (``openspiel/tic_tac_toe-v0``): OpenSpiel's ``tic_tac_toe`` as a text env

| | |
|---|---|
| Create | ``drmas_envs.make("openspiel/tic_tac_toe-v0", opponent=None, opponent_seat="random", invalid_action="random")`` |
| Agents | ``["player_0", "player_1"]`` (player 0 plays ``x`` and moves first, player 1 plays ``o``) |
| Turn order | alternating, 5 to 9 calls in self-play (with an opponent only the learner's seat calls) |
| Action | free text; the move is the last ``<action>NAME</action>``, NAME like ``x(1,1)`` (mark, row, column) |
| Observation | ``{"prompt", "messages"}``: rules, OpenSpiel's observation string (the board), legal action names |
| Fixed opponents | ``random-v0``, ``mcts-v0`` (:mod:`drmas_envs.games.opponents`) |

The observation string is the 3x3 board, rows top to bottom, ``.`` empty. Perfect information, so the view is the
board (the information-state string would be the list of action ids). The first mover's advantage is large.

## Rewards

Each seat receives its own return (``state.returns()``), zero-sum; each invalid call costs its agent
``format_penalty`` (0.1).

| Event | winner | loser |
|---|---|---|
| three in a row | +1 | -1 |
| full board, no line (draw) | 0 | 0 |
| ``invalid_action="forfeit"``: an invalid reply | +1 (``max_utility``) | -1 (``min_utility``) |

``EpisodeRecord.agent_rewards`` holds each seat's return; ``reward`` / ``won`` are the first learning seat's
(with an opponent, the learner's; in self-play, ``player_0``'s).

## Termination vs truncation

Episodes always **terminate** (at most 9 moves); never truncated. Infos as :mod:`drmas_envs.games.kuhn_poker`.

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
    """Tic-tac-toe (see the module docstring for the card)."""

    GAME = "tic_tac_toe"
    TITLE = "tic-tac-toe"
    RULES = (
        "Rules: a 3x3 board; player 0 places x, player 1 places o, alternately, on empty cells. Three of your marks "
        "in a row, column or diagonal wins; a full board without one is a draw. Your view is the board, rows top "
        "to bottom, '.' empty. An action x(r,c) marks row r, column c (0-based)."
    )
    VIEW = "observation"
    OPPONENTS = ("random-v0", "mcts-v0")
    metadata = {**OpenSpielEnv.metadata, "name": "openspiel_tic_tac_toe_v0"}


env, parallel_env = make_factories(raw_env)
