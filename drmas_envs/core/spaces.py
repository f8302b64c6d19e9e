"""Gymnasium spaces for text: any Python ``str`` up to a length, unicode and empty included."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

__all__ = ["AnyText", "message_space", "observation_space"]

#: Characters ``sample()`` draws from (printable ASCII); ``contains`` accepts every unicode character.
_SAMPLE_CHARSET = "".join(chr(c) for c in range(32, 127))


class AnyText(spaces.Text):
    """A text space containing every ``str`` of length ``min_length..max_length`` (characters, inclusive).

    :class:`gymnasium.spaces.Text` only contains strings over its charset and of length >= 1; LLM output is
    arbitrary unicode and may be empty, so this space accepts any ``str`` within the length bounds.
    ``sample()`` still returns printable ASCII.
    """

    def __init__(self, max_length: int = 1_000_000, *, min_length: int = 0, seed: Any = None) -> None:
        super().__init__(max_length, min_length=min_length, charset=_SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:  # noqa: D102
        length = int(self.np_random.integers(max(self.min_length, 1), min(self.max_length, 64) + 1))
        chars = self.np_random.choice(np.array(list(_SAMPLE_CHARSET)), size=length)
        return "".join(chars)

    def __repr__(self) -> str:
        return f"AnyText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, AnyText) and (other.min_length, other.max_length) == (self.min_length, self.max_length)


def message_space(max_chars: int) -> spaces.Dict:
    """One chat message ``{"role": str, "content": str}``."""
    return spaces.Dict({"role": AnyText(32), "content": AnyText(max_chars)})


def observation_space(max_chars: int = 1_000_000) -> spaces.Dict:
    """Observation of every drmas text env.

    Keys:
        ``prompt``: the agent's whole context as one flat string (system + user text).
        ``messages``: the same context as chat messages, a sequence of :func:`message_space`.

    No key is named ``observation``: PettingZoo's ``api_test`` dtype-checks such a key as an array.
    """
    return spaces.Dict(
        {
            "prompt": AnyText(max_chars),
            "messages": spaces.Sequence(message_space(max_chars), stack=False),
        }
    )
