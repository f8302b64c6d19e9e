"""Bounded-cost parsing of XML-like protocol tags in LLM output (untrusted text), shared by every env family.

Rules:

* The text is cut to ``max_chars`` characters (default 20,000) before any matching, so cost is bounded.
* A tag is ``<name>...</name>``; tag names are case-insensitive and may carry inner padding (``< verify >``).
* A *complete pair* is a closing tag with the last opening tag before it (``"<a> <a>q</a>"`` gives ``"q"``);
  content is stripped of surrounding whitespace (multi-line content keeps its inner newlines).
* Matching uses linear regex scans (no nested quantifiers, no backtracking blow-up).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Sequence

__all__ = ["MAX_ACTION_CHARS", "extract_tag", "iter_tags", "parse_verdict"]

#: Default cap on how much of one action is parsed (characters).
MAX_ACTION_CHARS = 20_000


@functools.lru_cache(maxsize=32)
def tag_patterns(name: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(opening, closing) patterns of tag ``name``.

    Raises:
        ValueError: ``name`` is not an identifier.
    """
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", name):
        raise ValueError(f"tag name must be an identifier like 'search', got {name!r}")
    return re.compile(rf"<[ \t]*{name}[ \t]*>", re.I), re.compile(rf"<[ \t]*/[ \t]*{name}[ \t]*>", re.I)


def iter_tags(text: str, name: str, *, max_chars: int = MAX_ACTION_CHARS) -> Iterator[str]:
    """Contents of the complete ``<name>...</name>`` pairs in ``text[:max_chars]``, in order, stripped.

    Raises:
        TypeError: ``text`` is not a str.
        ValueError: ``name`` is not an identifier.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    opening, closing = tag_patterns(name)
    text = text[:max_chars]
    start = 0
    for close in closing.finditer(text):
        last_open = None
        for last_open in opening.finditer(text, start, close.start()):  # noqa: B007  (keep the last one)
            pass
        if last_open is not None:
            yield text[last_open.end() : close.start()].strip()
        start = close.end()


def extract_tag(text: str, name: str, *, max_chars: int = MAX_ACTION_CHARS) -> str | None:
    """Content of the first complete ``<name>...</name>`` pair in ``text[:max_chars]``, stripped.

    Returns ``None`` when no complete pair exists (an empty string when the pair is empty).

    >>> extract_tag("think...<search>\\n  capital of France \\n</search><search>x</search>", "search")
    'capital of France'

    Raises:
        TypeError: ``text`` is not a str.
        ValueError: ``name`` is not an identifier.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    opening, closing = tag_patterns(name)
    text = text[:max_chars]
    close = closing.search(text)
    if close is None:
        return None
    last_open = None
    for last_open in opening.finditer(text, 0, close.start()):  # noqa: B007  (keep the last one)
        pass
    if last_open is None:
        return None
    return text[last_open.end() : close.start()].strip()


def parse_verdict(
    text: str, verdicts: Sequence[str] = ("yes", "no"), *, last: bool = False, max_chars: int = MAX_ACTION_CHARS
) -> str | None:
    """A verifier's verdict from ``<verify>...</verify>``: one of ``verdicts`` (lower case), else ``None``.

    The content is compared case-insensitively after stripping whitespace and trailing ``.``/``!``
    (``<verify> Yes. </verify>`` is ``"yes"``).

    Args:
        text: the verifier's output.
        verdicts: the accepted words (lower case): ``("yes", "no")`` for the search orchestrator's router,
            ``("approve", "reject")`` for the math teams.
        last: ``False``: only the first complete ``<verify>`` pair counts (a malformed first verdict is
            invalid); ``True``: the last pair holding an accepted verdict counts (a verifier may revise itself).
        max_chars: only this many leading characters are parsed.

    Raises:
        TypeError: ``text`` is not a str.
    """
    def word(content: str) -> str | None:
        w = content.strip().strip(".!").strip().lower()
        return w if w in verdicts else None

    if not last:
        content = extract_tag(text, "verify", max_chars=max_chars)
        return None if content is None else word(content)
    found = None
    for content in iter_tags(text, "verify", max_chars=max_chars):
        found = word(content) or found
    return found
