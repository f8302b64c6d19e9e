"""Reading a move from a reply: the last <action> pair, trimmed, case-insensitive, legal names only."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("pyspiel")

from drmas_envs.games.actions import match_action, parse_action  # noqa: E402

PARSE_CASES = [
    # (reply, parsed content)
    ("<action>Bet</action>", "Bet"),
    ("I think... <action>Pass</action> no: <ACTION>  bet \n</Action>", "bet"),  # the last pair wins
    ("<action>x(1,1)</action> trailing words", "x(1,1)"),
    ("<action></action>", ""),
    ("no tags at all: Bet", None),
    ("<action>Bet", None),  # no closing tag
    ("", None),
]


@pytest.mark.parametrize(("reply", "expected"), PARSE_CASES)
def test_parse_action(reply, expected):
    assert parse_action(reply) == expected


MATCH_CASES = [
    # (parsed, legal names, index)
    ("bet", ["Pass", "Bet"], 1),
    ("  PASS ", ["Pass", "Bet"], 0),
    ("x(1,1)", ["x(0,0)", "x(1,1)"], 1),
    ("x(1, 1)", ["x(0,0)", "x(1,1)"], None),  # inner text must match exactly
    ("Fold", ["Pass", "Bet"], None),
    ("", ["Pass", "Bet"], None),
    (None, ["Pass", "Bet"], None),
]


@pytest.mark.parametrize(("parsed", "legal", "expected"), MATCH_CASES)
def test_match_action(parsed, legal, expected):
    assert match_action(parsed, legal) == expected


def test_ambiguous_legal_names_are_an_error():
    with pytest.raises(ValueError, match=re.escape("legal action names are not distinct case-insensitively: ['a', 'A']")):
        match_action("a", ["a", "A"])
