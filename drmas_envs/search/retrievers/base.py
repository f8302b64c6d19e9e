"""The retriever protocol shared by every backend, input checks, the cache directory and passage formatting."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from drmas_envs.search.corpus import Passage
from drmas_envs.search.parsing import neutralize_tags

__all__ = ["Retriever", "RetrieverError", "RetrieverUnavailableError", "check_search_args", "default_cache_dir", "format_passages"]


class RetrieverError(RuntimeError):
    """A retriever failed (bad configuration, bad server reply)."""


class RetrieverUnavailableError(RetrieverError):
    """The retrieval server could not be reached within the configured timeout and retries.

    Attributes:
        reason: what failed, in one short line (the env shows it to the agents as the search result when
            ``retrieval_failure="observation"``); the message adds how to fix it.
    """

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason if reason is not None else message


@runtime_checkable
class Retriever(Protocol):
    """Batched top-k retrieval.

    ``search(queries, topk)`` returns, per query and in query order, up to ``topk`` passages ranked by
    decreasing score (fewer when fewer passages match at all). Implementations are thread-safe for
    concurrent ``search`` calls and cheap to share between many env instances.
    """

    name: str

    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """Per query, a ranked list of at most ``topk`` :class:`Passage` (``id``, ``title``, ``text``, ``score``)."""
        ...


def check_search_args(queries: Sequence[str], topk: int) -> list[str]:
    """Validate ``search`` arguments; returns the queries as a list.

    Raises:
        TypeError: ``queries`` is a bare ``str`` or holds non-str items.
        ValueError: ``topk`` is not an int >= 1.
    """
    if isinstance(queries, str):
        raise TypeError("queries must be a list of str (a batch), got a single str; wrap it: [query]")
    queries = list(queries)
    for q in queries:
        if not isinstance(q, str):
            raise TypeError(f"every query must be a str, got {type(q).__name__}")
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise ValueError(f"topk must be an int >= 1, got {topk!r}")
    return queries


def default_cache_dir() -> Path:
    """Where indexes are cached: ``$DRMAS_CACHE_DIR`` or ``~/.cache/drmas``."""
    return Path(os.environ.get("DRMAS_CACHE_DIR") or Path.home() / ".cache" / "drmas")


def format_passages(passages: Sequence[Passage], *, max_chars_per_passage: int = 2_000) -> str:
    """Search-R1's rendering of retrieved passages: ``Doc 1(Title: T) text`` lines.

    Passages are untrusted: protocol tags inside them are neutralised
    (:func:`drmas_envs.search.parsing.neutralize_tags`) and each body is cut to ``max_chars_per_passage``.
    An empty list renders as ``"(no results)"``.
    """
    if not passages:
        return "(no results)"
    lines = []
    for i, p in enumerate(passages, 1):
        text = p.text if len(p.text) <= max_chars_per_passage else p.text[:max_chars_per_passage] + " ..."
        lines.append(neutralize_tags(f"Doc {i}(Title: {p.title}) {text}"))
    return "\n".join(lines)
