"""Retrievers: ``bm25`` (bm25s), ``dense`` (sentence-transformers + faiss, built in process), ``faiss`` (a
prebuilt FAISS index + JSONL corpus, e.g. the paper's e5 index of wiki-18), ``http`` (retrieval-server client).

``make_retriever(name, corpus=..., **kwargs)`` builds one; in-process retrievers are *shared*: the same name,
corpus content (hash) and kwargs return the same object, so building 64 env instances builds one index.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from drmas_envs.search.corpus import Passage, corpus_hash, load_corpus_jsonl
from drmas_envs.search.retrievers.base import (
    Retriever,
    RetrieverError,
    RetrieverUnavailableError,
    check_search_args,
    default_cache_dir,
    format_passages,
)

__all__ = [
    "Retriever",
    "RetrieverError",
    "RetrieverUnavailableError",
    "RETRIEVERS",
    "make_retriever",
    "clear_retriever_cache",
    "check_search_args",
    "default_cache_dir",
    "format_passages",
]

#: name -> "module:Class"; imported lazily so that e.g. torch loads only for ``dense``.
RETRIEVERS: dict[str, str] = {
    "bm25": "drmas_envs.search.retrievers.bm25:BM25Retriever",
    "dense": "drmas_envs.search.retrievers.dense:DenseRetriever",
    "faiss": "drmas_envs.search.retrievers.faiss_index:FaissIndexRetriever",
    "http": "drmas_envs.search.retrievers.http:HTTPRetriever",
}

_SHARED: dict[tuple, Any] = {}
_SHARED_LOCK = threading.Lock()
# id(tuple corpus) -> (the tuple, its hash): immutable corpora are hashed once, not once per env instance
_TUPLE_HASHES: dict[int, tuple[tuple, str]] = {}


def _hash_of(passages: Sequence[Passage]) -> str:
    if isinstance(passages, tuple):
        hit = _TUPLE_HASHES.get(id(passages))
        if hit is not None and hit[0] is passages:
            return hit[1]
        digest = corpus_hash(passages)
        _TUPLE_HASHES[id(passages)] = (passages, digest)
        return digest
    return corpus_hash(passages)


def _load_class(name: str) -> type:
    import importlib

    module, cls = RETRIEVERS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def make_retriever(name: str, corpus: Sequence[Passage] | str | Path | None = None, *, shared: bool = True, **kwargs: Any) -> Retriever:
    """Build (or reuse) a retriever.

    Args:
        name: ``"bm25"``, ``"dense"``, ``"faiss"`` or ``"http"``.
        corpus: passages or a wiki-18 JSONL path; required for ``bm25``/``dense``; for ``faiss`` the JSONL path
            the index was built from (read lazily, never loaded whole); unused by ``http``.
        shared: reuse the instance built earlier in this process for the same (name, corpus hash, kwargs).
        **kwargs: passed to the class (``BM25Retriever``: cache_dir, k1, b, stemmer; ``DenseRetriever``: model,
            batch_size, device, cache_dir, e5_prefixes; ``FaissIndexRetriever``: index, model, encoder_name,
            pooling, max_length, fp16, device, faiss_gpu, mmap, cache_dir; ``HTTPRetriever``: url (one or a list), timeout,
            max_retries, backoff, total_timeout, protocol).

    Raises:
        ValueError: unknown ``name`` (lists the accepted ones) or a missing corpus.
        TypeError: a kwarg the chosen retriever does not take.
    """
    if name not in RETRIEVERS:
        raise ValueError(f"unknown retriever {name!r}; accepted: {sorted(RETRIEVERS)}")
    cls = _load_class(name)
    if name == "http":
        if corpus is not None:
            raise ValueError("the http retriever takes no corpus: the server holds it (pass url=...)")
        key: tuple = (name, None, _freeze(kwargs))
        build = lambda: cls(**kwargs)  # noqa: E731
    elif name == "faiss":
        if not isinstance(corpus, (str, Path)):
            raise ValueError("the faiss retriever needs corpus=<path of the JSONL its index was built from>")
        key = (name, str(Path(corpus).resolve()), _freeze(kwargs))
        build = lambda: cls(corpus=corpus, **kwargs)  # noqa: E731
    else:
        if corpus is None:
            raise ValueError(f"the {name} retriever needs a corpus: a list of Passage or a wiki-18 JSONL path")
        passages = load_corpus_jsonl(corpus) if isinstance(corpus, (str, Path)) else corpus
        key = (name, _hash_of(passages), _freeze(kwargs))
        build = lambda: cls(passages, **kwargs)  # noqa: E731
    if not shared:
        return build()
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = build()
        return _SHARED[key]


def clear_retriever_cache() -> None:
    """Forget the shared in-process retrievers (indexes on disk stay)."""
    with _SHARED_LOCK:
        _SHARED.clear()
        _TUPLE_HASHES.clear()


def _freeze(kwargs: dict[str, Any]) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in kwargs.items()))
