"""Bounded-cost parsing of the search envs' XML-like tags in LLM output (untrusted text).

``search-orchestrator-v0`` matches tags exactly, as the Dr. MAS reference does
(:mod:`drmas_envs.core.projection`), and reads the Verifier's verdict with :func:`reference_verdict`. The lenient
rules below are ``search-r1-v0``'s (and :func:`parse_verdict` is kept for callers that want them):

* The text is cut to ``max_chars`` characters (default 20,000) before any matching, so cost is bounded.
* A tag is ``<name>...</name>``; tag names are case-insensitive and may carry inner padding (``< search >``).
* The *first complete* pair wins: the first closing tag, paired with the last opening tag before it
  (``"<search> <search>q</search>"`` gives ``"q"``). Content is stripped of surrounding whitespace (multi-line
  content keeps its inner newlines).
* Matching uses two linear regex scans (no nested quantifiers, no backtracking blow-up).
"""

from __future__ import annotations

import functools
import re

__all__ = [
    "MAX_ACTION_CHARS", "PROTOCOL_TAGS", "extract_tag", "first_tag", "parse_verdict", "reference_verdict",
    "neutralize_tags",
]

#: Default cap on how much of one action is parsed (characters).
MAX_ACTION_CHARS = 20_000

#: Tag names of the search protocols; retrieved text may not forge them (see :func:`neutralize_tags`).
PROTOCOL_TAGS = ("search", "answer", "verify", "information", "think")


@functools.lru_cache(maxsize=32)
def _tag_patterns(name: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", name):
        raise ValueError(f"tag name must be an identifier like 'search', got {name!r}")
    return re.compile(rf"<[ \t]*{name}[ \t]*>", re.I), re.compile(rf"<[ \t]*/[ \t]*{name}[ \t]*>", re.I)


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
    opening, closing = _tag_patterns(name)
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


def parse_verdict(text: str, *, max_chars: int = MAX_ACTION_CHARS) -> str | None:
    """The Verifier's verdict: ``"yes"`` or ``"no"`` from ``<verify>...</verify>``, else ``None`` (invalid).

    Case and surrounding whitespace/punctuation are ignored (``<verify> Yes. </verify>`` is ``"yes"``).
    """
    content = extract_tag(text, "verify", max_chars=max_chars)
    if content is None:
        return None
    word = content.strip().strip(".!").strip().lower()
    return word if word in ("yes", "no") else None


def reference_verdict(projected: str) -> str | None:
    """The search Verifier's routing verdict as the Dr. MAS reference reads it, else ``None``.

    ``projected`` is the Verifier's reply after :func:`drmas_envs.core.projection.project_action` with
    ``keep_whole=True`` (the first ``<verify>`` content stripped in place). ``"yes"`` if it contains
    ``<verify>yes</verify>`` (any case), else ``"no"`` if it contains ``<verify>no</verify>``, else ``None``
    (``langfengQ/DrMAS agent_system/agent/agents/search/verifier_agent.py:72-79``: yes is checked first; the
    reference routes ``None`` to the Answer agent).

    >>> reference_verdict("<verify>no</verify> ... <verify>YES</verify>"), reference_verdict("<verify>maybe</verify>")
    ('yes', None)
    """
    lowered = projected.lower()
    if "<verify>yes</verify>" in lowered:
        return "yes"
    if "<verify>no</verify>" in lowered:
        return "no"
    return None


_FORGED = re.compile(r"<(?=[ \t]*/?[ \t]*(?:" + "|".join(PROTOCOL_TAGS) + r")\b)", re.I)


def neutralize_tags(text: str) -> str:
    """Retrieved text is untrusted data: escape ``<`` before protocol tag names so a passage cannot forge
    ``</information>`` or ``<answer>`` markup in an agent's context (``<answer>`` becomes ``&lt;answer>``)."""
    return _FORGED.sub("&lt;", text)


def first_tag(text: str, names: tuple[str, ...], *, max_chars: int = MAX_ACTION_CHARS) -> tuple[str, str] | None:
    """``(name, content)`` of whichever complete tag among ``names`` closes first in ``text[:max_chars]``.

    Search-R1 acts on the first ``<search>``/``<answer>`` it finds; this is that rule with bounded cost.

    >>> first_tag("<search>a</search> then <answer>b</answer>", ("search", "answer"))
    ('search', 'a')
    """
    text = text[:max_chars]
    best: tuple[int, str, str] | None = None
    for name in names:
        close = _tag_patterns(name)[1].search(text)
        if close is None or (best is not None and close.start() >= best[0]):
            continue
        content = extract_tag(text[: close.end()], name, max_chars=max_chars)
        if content is not None:
            best = (close.start(), name, content)
    return None if best is None else (best[1], best[2])
