"""Resolve the search envs' data arguments: which tasks, which corpus, which retriever.

Defaults (no arguments): the synthetic encyclopedia (:mod:`drmas_envs.search.synthetic`) and an in-process BM25
over its passages, so ``drmas_envs.make("search-orchestrator-v0")`` works on a fresh machine with no files.
Everything expensive is cached per process (the encyclopedia per config, HotpotQA corpora per file, retrievers
per corpus hash), so building many env instances builds one index.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from drmas_envs.core import TaskSource
from drmas_envs.data.files import read_rows
from drmas_envs.search.corpus import Passage, hotpotqa_corpus, load_corpus_jsonl
from drmas_envs.search.data import load_qa_file, load_qa_hf
from drmas_envs.search.retrievers import Retriever, make_retriever
from drmas_envs.search.synthetic import EncyclopediaConfig, generate_encyclopedia

__all__ = ["encyclopedia_config", "resolve_data", "resolve_retriever", "resolve_search_env", "load_corpus"]


@functools.lru_cache(maxsize=16)
def _file_tasks_and_contexts(path: str, mtime: float, limit: int | None) -> tuple[TaskSource, tuple[Passage, ...] | None]:
    tasks = load_qa_file(path, limit=limit)
    rows = [row for _, row in read_rows(path)][: limit if limit is not None else None]
    has_context = bool(rows) and all("context" in r for r in rows)
    return tasks, (tuple(hotpotqa_corpus(rows)) if has_context else None)


def _hf_tasks(spec: str, limit: int | None) -> TaskSource:
    """``hf:<id>[:<config>][@<split>]`` (split defaults to ``validation``) via :func:`load_qa_hf`.

    Raises:
        ValueError: a malformed spec.
    """
    body, _, split = spec[3:].partition("@")
    name, _, config = body.partition(":")
    if not name:
        raise ValueError(f"malformed Hugging Face spec {spec!r}: expected 'hf:<id>[:<config>][@<split>]'")
    return load_qa_hf(name, split or "validation", config=config or None, limit=limit)


@functools.lru_cache(maxsize=16)
def _corpus_file(path: str, mtime: float) -> tuple[Passage, ...]:
    return tuple(load_corpus_jsonl(path))


def encyclopedia_config(synthetic: Mapping[str, Any] | EncyclopediaConfig | None) -> EncyclopediaConfig:
    """The :class:`EncyclopediaConfig` of the env kwarg ``synthetic`` (a config, a dict of its fields, or None for
    the defaults).

    Raises:
        TypeError: an unknown field (the message lists the accepted ones).
        ValueError: a bad field value (:class:`EncyclopediaConfig`'s checks).
    """
    if isinstance(synthetic, EncyclopediaConfig):
        return synthetic
    fields = dict(synthetic or {})
    if "hops" in fields:
        fields["hops"] = tuple(fields["hops"])
    try:
        return EncyclopediaConfig(**fields)
    except TypeError as e:
        names = ", ".join(f.name for f in dataclasses.fields(EncyclopediaConfig))
        raise TypeError(f"synthetic={synthetic!r}: {e}; fields: {names}") from e


def resolve_data(
    tasks: TaskSource | str | Path | None,
    corpus: Sequence[Passage] | str | Path | None,
    synthetic: Mapping[str, Any] | EncyclopediaConfig | None,
    *,
    limit: int | None = None,
) -> tuple[TaskSource, Sequence[Passage] | None]:
    """``(task source, corpus passages or None)`` for the env kwargs ``tasks``, ``corpus`` and ``synthetic``.

    * ``tasks=None``: the synthetic encyclopedia built from ``synthetic`` (an :class:`EncyclopediaConfig` or a dict
      of its fields); its passages are the corpus unless ``corpus`` is given.
    * ``tasks=<path>``: a QA file (:func:`drmas_envs.search.data.load_qa_file`); for HotpotQA rows the corpus
      defaults to the union of their context paragraphs.
    * ``tasks="hf:<id>[:<config>][@<split>]"``: a Hugging Face dataset (online only; fails fast offline), e.g.
      ``"hf:hotpot_qa:distractor@validation"``; give a ``corpus`` (or use ``retriever="http"``).
    * ``tasks=<TaskSource>``: used as is.
    * ``tasks`` given together with ``synthetic``: those tasks are asked about that synthetic world, whose passages
      are the corpus (held-out questions about the world a run trained on, written to a file by
      ``SearchTextEnv.generated_tasks`` and played back by ``drmas crossplay``).
    * ``corpus=<path>`` (wiki-18 JSONL) or a sequence of :class:`Passage` overrides the default corpus.

    Raises:
        TypeError: an unknown ``synthetic`` field, or ``tasks`` of another type.
        FileNotFoundError: a ``tasks`` or ``corpus`` path that is not a file.
    """
    passages: Sequence[Passage] | None = None
    if tasks is None:
        enc = generate_encyclopedia(encyclopedia_config(synthetic))
        task_source, passages = enc.tasks, enc.passages
    elif isinstance(tasks, str) and tasks.startswith("hf:"):
        task_source = _hf_tasks(tasks, limit)
    elif isinstance(tasks, (str, Path)):
        path = Path(tasks)
        if not path.is_file():
            raise FileNotFoundError(f"tasks file {path} not found (give a QA .jsonl/.json/.parquet, or tasks=None for the synthetic default)")
        task_source, passages = _file_tasks_and_contexts(str(path.resolve()), path.stat().st_mtime, limit)
    elif isinstance(tasks, TaskSource):
        task_source = tasks
    else:
        raise TypeError(f"tasks must be None, a path or a TaskSource, got {type(tasks).__name__}")
    if tasks is not None and synthetic is not None:  # questions from elsewhere about the synthetic world
        passages = generate_encyclopedia(encyclopedia_config(synthetic)).passages
    if isinstance(corpus, (str, Path)):
        path = Path(corpus)
        if not path.is_file():
            raise FileNotFoundError(f"corpus file {path} not found (expected wiki-18 JSONL rows {{'id', 'contents'}})")
        passages = _corpus_file(str(path.resolve()), path.stat().st_mtime)
    elif corpus is not None:
        passages = corpus
    return task_source, passages


def load_corpus(spec: str | Path) -> Sequence[Passage]:
    """Passages from a corpus spec: ``"synthetic"`` (the default encyclopedia), a wiki-18 JSONL file
    (``{"id", "contents"}`` rows), or a HotpotQA file (the union of its context paragraphs), told apart by the
    first row.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the first row is neither a corpus row nor a HotpotQA row.
    """
    if str(spec) == "synthetic":
        return generate_encyclopedia(EncyclopediaConfig()).passages
    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"corpus {path} not found; give 'synthetic', a wiki-18 .jsonl or a HotpotQA file")
    first = next((row for _, row in read_rows(path)), None)
    if first is not None and "context" in first:
        return hotpotqa_corpus(row for _, row in read_rows(path))
    if first is not None and ("contents" in first or "text" in first):
        return _corpus_file(str(path.resolve()), path.stat().st_mtime)
    raise ValueError(f"{path}: first row has fields {sorted(first or {})}; expected a corpus row {{'id', 'contents'}} "
                     "or a HotpotQA row with 'context'")


def resolve_retriever(retriever: str | Retriever, passages: Sequence[Passage] | None, retriever_kwargs: Mapping[str, Any] | None) -> Retriever:
    """A retriever instance for the env kwarg ``retriever`` (a name from ``RETRIEVERS`` or any object with
    ``search(queries, topk)``), shared across env instances via :func:`make_retriever`.

    Raises:
        ValueError: a local retriever without a corpus, or an unknown name.
        TypeError: ``retriever`` is neither a name nor a retriever.
    """
    if not isinstance(retriever, str):
        if not callable(getattr(retriever, "search", None)):
            raise TypeError(f"retriever must be a name ('bm25', 'dense', 'faiss', 'http') or have .search(queries, topk), got {retriever!r}")
        if retriever_kwargs:
            raise TypeError("retriever_kwargs apply only when retriever is given by name")
        return retriever
    kwargs = dict(retriever_kwargs or {})
    if retriever == "http":
        return make_retriever("http", **kwargs)
    if retriever == "faiss":  # a prebuilt index: its corpus file is read lazily, never loaded by the env
        return make_retriever("faiss", kwargs.pop("corpus", None), **kwargs)
    if passages is None:
        raise ValueError(f"the {retriever!r} retriever needs a corpus: pass corpus=<wiki-18 .jsonl> or use retriever='http'")
    return make_retriever(retriever, passages, **kwargs)


def resolve_search_env(
    tasks: Any,
    corpus: Any,
    synthetic: Mapping[str, Any] | None,
    retriever: str | Retriever,
    retriever_kwargs: Mapping[str, Any] | None,
    prompts: Mapping[str, str] | None,
    default_prompts: Mapping[str, str],
) -> tuple[TaskSource, Retriever, dict[str, str]]:
    """What every search env builds from its kwargs: (tasks, shared retriever, prompts merged over the defaults).

    Raises:
        ValueError: unknown prompt keys (checked first, before any data loads), plus :func:`resolve_data`'s and
            :func:`resolve_retriever`'s errors.
    """
    unknown = set(prompts or {}) - set(default_prompts)
    if unknown:
        raise ValueError(f"unknown prompt keys {sorted(unknown)}; accepted: {sorted(default_prompts)}")
    task_source, passages = resolve_data(tasks, corpus, synthetic)
    return task_source, resolve_retriever(retriever, passages, retriever_kwargs), {**default_prompts, **(prompts or {})}
