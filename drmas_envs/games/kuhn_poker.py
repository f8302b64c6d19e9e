r"""# Kuhn poker (``openspiel/kuhn_poker-v0``): OpenSpiel's ``kuhn_poker`` as a text env

| | |
|---|---|
| Create | ``drmas_envs.make("openspiel/kuhn_poker-v0", opponent=None, opponent_seat="random", invalid_action="random")`` |
| Agents | ``["player_0", "player_1"]`` (OpenSpiel's players 0 and 1; player 0 acts first) |
| Turn order | the game's: 2 or 3 calls in self-play (with an opponent only the learner's seat calls) |
| Action | free text; the move is the last ``<action>NAME</action>``, NAME in ``Pass``, ``Bet`` (any case) |
| Observation | ``{"prompt", "messages"}``: rules, OpenSpiel's information-state string, legal action names |
| Fixed opponents | ``random-v0``, ``cfr-v0`` (:mod:`drmas_envs.games.opponents`) |

Three cards (0 = Jack, 1 = Queen, 2 = King), one dealt to each player by chance (the env's ``np_random``); each
antes 1 chip. The information-state string is the player's card followed by the moves so far (``p`` pass, ``b``
bet): ``"2pb"`` holds the King; player 0 passed, player 1 bet. Under optimal play player 0 expects -1/18 chips: the
seats' reward distributions differ by construction.

## Rewards

Each seat receives its own return in chips (OpenSpiel's ``state.returns()``), zero-sum; each invalid call costs its
agent ``format_penalty`` (0.1).

| Event | winner | loser |
|---|---|---|
| showdown after pass, pass (higher card wins) | +1 | -1 |
| showdown after a bet and a call | +2 | -2 |
| the other player folds (passes after a bet) | +1 | -1 |
| ``invalid_action="forfeit"``: an invalid reply | +2 (``max_utility``) | -2 (``min_utility``) |

``EpisodeRecord.agent_rewards`` holds each seat's return; ``reward`` / ``won`` are the first learning seat's
(with an opponent, the learner's; in self-play, ``player_0``'s).

## Termination vs truncation

Episodes always **terminate** (the game ends after at most 3 moves); never truncated. Final infos: ``returns``
(list by player), ``learners``, ``opponent``, ``forfeit``, ``moves`` (``[agent, action name]``, opponent moves
included), ``history`` (OpenSpiel action ids, chance outcomes included). Per-call infos: ``action`` (the move
applied), ``parsed_action``, ``fallback`` (``None``, ``"random"`` or ``"forfeit"``).

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
    """Kuhn poker (see the module docstring for the card)."""

    GAME = "kuhn_poker"
    TITLE = "Kuhn poker"
    RULES = (
        "Rules: a deck of three cards, 0 = Jack, 1 = Queen, 2 = King; each player antes 1 chip and gets one card. "
        "Players alternate: Pass or Bet (1 chip). After a bet, Bet calls it and Pass folds (the bettor wins the "
        "pot). After pass-pass or bet-call, the higher card wins the pot. Your view is your card followed by the "
        "moves so far (p = pass, b = bet)."
    )
    VIEW = "information_state"
    OPPONENTS = ("random-v0", "cfr-v0")
    metadata = {**OpenSpielEnv.metadata, "name": "openspiel_kuhn_poker_v0"}


env, parallel_env = make_factories(raw_env)
