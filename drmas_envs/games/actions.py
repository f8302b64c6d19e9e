"""Reading a move from a reply: ``<action>NAME</action>``, NAME one of the legal actions' names.

Convention (every :mod:`drmas_envs.games` env):

* the reply's **last** complete ``<action>...</action>`` pair counts (a model may think aloud, quote the format or
  change its mind before its final move); tags are parsed by :mod:`drmas_envs.core.tags` (case-insensitive tag
  names, bounded cost: only the first :data:`~drmas_envs.core.tags.MAX_ACTION_CHARS` characters are read);
* its content is stripped of surrounding whitespace and compared **case-insensitively** (``str.casefold``) with the
  names OpenSpiel gives the legal actions (``state.action_to_string(player, action)``); inner text must match
  exactly (``x(1,1)``, not ``x(1, 1)``);
* no pair, or a name that is not legal now, makes the reply invalid (the env then applies its ``invalid_action``
  fallback).

>>> parse_action("I hold the King. <action>Pass</action> no wait <action> bet </action>")
'bet'
>>> match_action("bet", ["Pass", "Bet"]), match_action("Fold", ["Pass", "Bet"]), match_action(None, ["Pass"])
(1, None, None)
"""

from __future__ import annotations

from collections.abc import Sequence

from drmas_envs.core.tags import iter_tags

__all__ = ["parse_action", "match_action"]


def parse_action(text: str) -> str | None:
    """Content of the last complete ``<action>...</action>`` pair of ``text``, stripped; ``None`` when none.

    Raises:
        TypeError: ``text`` is not a str.
    """
    found = None
    for content in iter_tags(text, "action"):
        found = content
    return found


def match_action(name: str | None, legal_names: Sequence[str]) -> int | None:
    """Index into ``legal_names`` of the name equal to ``name`` (stripped, case-insensitive); ``None`` when none.

    Raises:
        ValueError: two legal names are equal case-insensitively (the reply could not be read unambiguously).
    """
    folded = [n.strip().casefold() for n in legal_names]
    if len(set(folded)) != len(folded):
        raise ValueError(f"legal action names are not distinct case-insensitively: {list(legal_names)}")
    if name is None:
        return None
    key = name.strip().casefold()
    return folded.index(key) if key in folded else None
