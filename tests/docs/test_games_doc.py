"""docs/games.md's example runs as written and gives the returns it shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("pyspiel")

DOC = Path(__file__).resolve().parents[2] / "docs" / "games.md"


def test_one_episode_example():
    code = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)[0]
    scope: dict = {}
    exec(code, scope)  # noqa: S102 - the documentation's own snippet
    assert scope["record"].agent_rewards == {"player_0": 2.0, "player_1": -2.0}
    assert scope["record"].metrics["moves"] == [["player_0", "Bet"], ["player_1", "Bet"]]
    assert "# {'player_0': 2.0, 'player_1': -2.0}" in code and "# [['player_0', 'Bet'], ['player_1', 'Bet']]" in code
