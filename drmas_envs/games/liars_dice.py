r"""# Liar's dice (``openspiel/liars_dice-v0``): OpenSpiel's ``liars_dice`` as a text env

| | |
|---|---|
| Create | ``drmas_envs.make("openspiel/liars_dice-v0", opponent=None, opponent_seat="random", invalid_action="random")`` |
| Agents | ``["player_0", "player_1"]`` (OpenSpiel's players 0 and 1; player 0 bids first) |
| Turn order | alternating bids until one player calls ``Liar`` (2 to 13 calls in self-play) |
| Action | free text; the move is the last ``<action>NAME</action>``, NAME a bid ``q-f`` (e.g. ``1-4``) or ``Liar`` |
| Observation | ``{"prompt", "messages"}``: rules, OpenSpiel's information-state string, legal action names |
| Fixed opponents | ``random-v0`` (:mod:`drmas_envs.games.opponents`) |

OpenSpiel's defaults: two players, one six-sided die each, rolled by chance (the env's ``np_random``). A bid
``q-f`` claims that at least ``q`` of all dice show face ``f``; 6 is wild (counts as every face). Each bid must be
higher than the last. ``Liar`` challenges the last bid: if it holds the bidder wins, else the challenger wins. The
information-state string is the player's own die followed by the bids so far (``"2 1-4"``: rolled a 2; a bid of
one 4 was made).

## Rewards

Each seat receives its own return (``state.returns()``), zero-sum; each invalid call costs its agent
``format_penalty`` (0.1).

| Event | winner | loser |
|---|---|---|
| ``Liar`` called: the bid holds (bidder wins) or not (challenger wins) | +1 | -1 |
| ``invalid_action="forfeit"``: an invalid reply | +1 (``max_utility``) | -1 (``min_utility``) |

``EpisodeRecord.agent_rewards`` holds each seat's return; ``reward`` / ``won`` are the first learning seat's
(with an opponent, the learner's; in self-play, ``player_0``'s).

## Termination vs truncation

Episodes always **terminate** (at most 13 moves: bids only rise); never truncated. Infos as
:mod:`drmas_envs.games.kuhn_poker`.

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
    """Liar's dice (see the module docstring for the card)."""

    GAME = "liars_dice"
    TITLE = "Liar's dice"
    RULES = (
        "Rules: each player secretly rolls one six-sided die. Players take turns bidding 'q-f': at least q of all "
        "dice show face f (6 is wild: it counts as every face). Each bid must be higher than the last. Instead of "
        "bidding you may call Liar on the last bid: if it holds, the bidder wins; otherwise you win. Your view is "
        "your own die followed by the bids so far."
    )
    VIEW = "information_state"
    OPPONENTS = ("random-v0",)
    metadata = {**OpenSpielEnv.metadata, "name": "openspiel_liars_dice_v0"}


env, parallel_env = make_factories(raw_env)
