r"""# Leduc poker (``openspiel/leduc_poker-v0``): OpenSpiel's ``leduc_poker`` as a text env

| | |
|---|---|
| Create | ``drmas_envs.make("openspiel/leduc_poker-v0", opponent=None, opponent_seat="random", invalid_action="random")`` |
| Agents | ``["player_0", "player_1"]`` (OpenSpiel's players 0 and 1; player 0 acts first in each round) |
| Turn order | the game's: 2 to 8 calls in self-play (with an opponent only the learner's seat calls) |
| Action | free text; the move is the last ``<action>NAME</action>``, NAME in ``Fold``, ``Call``, ``Raise`` (any case) |
| Observation | ``{"prompt", "messages"}``: rules, OpenSpiel's information-state string, legal action names |
| Fixed opponents | ``random-v0``, ``cfr-v0`` (:mod:`drmas_envs.games.opponents`) |

Six cards, two of each rank (0-1 Jack, 2-3 Queen, 4-5 King); each player antes 1 chip and gets one private card;
two betting rounds (raise 2 chips in round 1, 4 in round 2, at most two raises a round) with one public card dealt
between them. The information-state string reads ``[Observer: k][Private: c][Round r][Player: p][Pot: ..]
[Money: ..][Public: c][Round1: ..][Round2: ..]``; the rounds list action ids (0 Fold, 1 Call, 2 Raise).

## Rewards

Each seat receives its own return in chips (``state.returns()``), zero-sum; each invalid call costs its agent
``format_penalty`` (0.1).

| Event | winner | loser |
|---|---|---|
| showdown (a pair with the public card beats a high card; equal ranks split the pot) | + the loser's stake | - its stake (1 to 13 chips) |
| the other player folds | + the folder's stake | - its stake |
| ``invalid_action="forfeit"``: an invalid reply | +13 (``max_utility``) | -13 (``min_utility``) |

``EpisodeRecord.agent_rewards`` holds each seat's return; ``reward`` / ``won`` are the first learning seat's
(with an opponent, the learner's; in self-play, ``player_0``'s).

## Termination vs truncation

Episodes always **terminate** (at most 8 moves); never truncated. Infos as :mod:`drmas_envs.games.kuhn_poker`.

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
    """Leduc poker (see the module docstring for the card)."""

    GAME = "leduc_poker"
    TITLE = "Leduc poker"
    RULES = (
        "Rules: six cards, two of each rank (cards 0-1 Jack, 2-3 Queen, 4-5 King); each player antes 1 chip and "
        "gets one private card. Two betting rounds (raise 2 chips in round 1, 4 in round 2, at most two raises a "
        "round); one public card is dealt after round 1. Fold gives up the pot, Call matches the bet (or checks), "
        "Raise bets more. At showdown a private card of the public card's rank (a pair) wins, else the higher rank; "
        "equal ranks split the pot. In your view the rounds list the moves as 0 = Fold, 1 = Call, 2 = Raise."
    )
    VIEW = "information_state"
    OPPONENTS = ("random-v0", "cfr-v0")
    metadata = {**OpenSpielEnv.metadata, "name": "openspiel_leduc_poker_v0"}


env, parallel_env = make_factories(raw_env)
