"""A prebuilt FAISS index over a JSONL corpus, queried as the Dr. MAS reference's retrieval server queries it.

This serves the files the paper's data instructions download (``drmas data list``, recipe ``wiki18``:
``e5_Flat.index``, a flat inner-product index of wiki-18's 21M passages embedded with e5-base-v2, and
``wiki-18.jsonl``) without re-embedding anything: a query is embedded by
:class:`~drmas_envs.search.retrievers.encoder.QueryEncoder` exactly as the reference server does
(``langfengQ/DrMAS examples/search/retriever/retrieval_server.py:58-110``), searched in the index, and row ``i`` of
the corpus file is the passage of vector ``i`` (``:216-227``, ``load_docs`` at ``:30-32``).

Memory: the corpus is read lazily (:class:`JsonlCorpus`: one byte offset per row, 8 bytes x 21M = 168 MB, built
once and cached beside the cache dir), so only the index is resident. wiki-18's flat index holds 21M x 768
float32 = about 65 GB: loaded whole by default; ``mmap=True`` maps it from disk instead (faiss
``IO_FLAG_MMAP_IFC``; a search then reads it through the page cache); ``faiss_gpu=True`` shards it over every
visible GPU in fp16, as the reference's ``--faiss_gpu`` (``:199-203``; needs a faiss build with GPU support).

For small corpora without a prebuilt index, the in-process ``dense`` and ``bm25`` retrievers remain.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

from drmas_envs.search.corpus import Passage, passage_from_document
from drmas_envs.search.retrievers.base import RetrieverError, check_search_args, default_cache_dir
from drmas_envs.search.retrievers.encoder import QueryEncoder

__all__ = ["FaissIndexRetriever", "JsonlCorpus"]

log = logging.getLogger(__name__)

_CHUNK = 64 << 20


class JsonlCorpus(Sequence[Passage]):
    """A wiki-18 / FlashRAG JSONL corpus (``{"id", "contents"}`` rows) read row by row on demand.

    Row ``i`` is the ``i``-th non-blank line. The line offsets are found in one pass (numpy over 64 MB chunks) and
    cached as ``<cache_dir>/corpus-offsets/<name>-<key>.npy``, keyed by the file's path, size and mtime.
    Thread-safe (``os.pread``).

    Args:
        path: the JSONL file.
        cache_dir: root of the offsets cache (``None``: the default cache dir; ``False``: no cache).

    Raises:
        FileNotFoundError: no such file. ValueError: an empty corpus; a malformed row when it is read.
    """

    def __init__(self, path: str | Path, *, cache_dir: str | Path | None | bool = None) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(
                f"corpus file {self.path} not found (expected JSONL rows {{'id', 'contents'}})"
            )
        self._starts, self._ends = self._offsets(cache_dir)
        if len(self._starts) == 0:
            raise ValueError(f"{self.path}: the corpus is empty")
        self._fd = os.open(self.path, os.O_RDONLY)

    def _offsets(self, cache_dir: str | Path | None | bool) -> tuple[np.ndarray, np.ndarray]:
        stat = self.path.stat()
        key = hashlib.sha256(f"{self.path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[
            :16
        ]
        cached = None
        if cache_dir is not False:
            root = default_cache_dir() if cache_dir in (None, True) else Path(cache_dir)
            cached = root / "corpus-offsets" / f"{self.path.name}-{key}.npy"
            if cached.is_file():
                both = np.load(cached)
                return both[0], both[1]
        newlines = []
        with self.path.open("rb") as f:
            base = 0
            while chunk := f.read(_CHUNK):
                newlines.append(
                    np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10).astype(np.int64) + base
                )
                base += len(chunk)
        ends = np.concatenate([*newlines, np.array([base], dtype=np.int64)]) if newlines else np.array([base])
        starts = np.concatenate([np.array([0], dtype=np.int64), ends[:-1] + 1])
        keep = ends > starts  # blank lines (and the empty "line" after a final newline) are not rows
        starts, ends = starts[keep], ends[keep]
        if cached is not None:
            try:
                cached.parent.mkdir(parents=True, exist_ok=True)
                tmp = cached.with_suffix(f".tmp{os.getpid()}.npy")
                np.save(tmp, np.stack([starts, ends]))
                tmp.replace(cached)
            except OSError as e:
                log.debug("corpus offsets not cached at %s: %s", cached, e)
        return starts, ends

    def __len__(self) -> int:
        return len(self._starts)

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i`` as parsed JSON.

        Raises:
            IndexError: ``i`` out of range. ValueError: the row is not valid JSON (names file and row).
        """
        if not -len(self) <= i < len(self):
            raise IndexError(f"row {i} out of range for a corpus of {len(self)} rows")
        start, end = int(self._starts[i]), int(self._ends[i])
        raw = os.pread(self._fd, end - start, start)
        try:
            return json.loads(raw)
        except ValueError as e:
            raise ValueError(f"{self.path}: row {i} is not valid JSON ({e})") from e

    @overload
    def __getitem__(self, i: int) -> Passage: ...
    @overload
    def __getitem__(self, i: slice) -> list[Passage]: ...

    def __getitem__(self, i: int | slice) -> Passage | list[Passage]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return passage_from_document(self.row(i), where=f"{self.path} row {i}")

    def close(self) -> None:
        """Close the file (safe to call twice)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        try:
            self.close()
        except (AttributeError, OSError):
            pass


class FaissIndexRetriever:
    """Top-k search in a prebuilt FAISS index whose vector ``i`` is row ``i`` of a JSONL corpus.

    Args:
        index: the ``.index`` file (e.g. ``e5_Flat.index``).
        corpus: the JSONL corpus it was built from (e.g. ``wiki-18.jsonl``).
        model: the query encoder (default ``intfloat/e5-base-v2``, the reference's; a local directory offline).
        encoder_name, pooling, max_length, fp16, device, query_prefix, normalize: the
            :class:`~drmas_envs.search.retrievers.encoder.QueryEncoder`'s (the reference's defaults).
        faiss_gpu: shard the index over every visible GPU in fp16 (the reference's ``--faiss_gpu``).
        mmap: map the index from disk instead of loading it (flat indexes).
        cache_dir: where :class:`JsonlCorpus` caches its row offsets.

    Raises:
        RetrieverError: faiss missing, an unreadable index, ``faiss_gpu`` without GPUs, an index and corpus of
            different sizes, or the encoder's errors.
        FileNotFoundError: a missing index or corpus file.
    """

    name = "faiss"

    def __init__(self, index: str | Path, corpus: str | Path, *, model: str | Path = "intfloat/e5-base-v2",
                 encoder_name: str | None = None, pooling: str = "mean", max_length: int = 256,
                 fp16: bool | None = None, device: str = "cpu", query_prefix: str | None = None,
                 normalize: bool | None = None, faiss_gpu: bool = False, mmap: bool = False,
                 cache_dir: str | Path | None | bool = None) -> None:  # fmt: skip
        try:
            import faiss
        except ImportError as e:
            raise RetrieverError(f"the faiss retriever needs faiss: pip install 'drmas[dense]' ({e})") from e
        index_path = Path(index)
        if not index_path.is_file():
            raise FileNotFoundError(f"FAISS index {index_path} not found")
        self.passages = JsonlCorpus(corpus, cache_dir=cache_dir)
        flags = (faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY) if mmap else 0
        try:
            self._index = faiss.read_index(str(index_path), flags)
        except RuntimeError as e:
            raise RetrieverError(f"cannot read the FAISS index {index_path}: {e}") from e
        if self._index.ntotal != len(self.passages):
            raise RetrieverError(
                f"the FAISS index {index_path} holds {self._index.ntotal} vectors but the corpus {corpus} has "
                f"{len(self.passages)} rows: vector i must be row i, so both must come from the same build"
            )
        if faiss_gpu:
            if not hasattr(faiss, "index_cpu_to_all_gpus") or faiss.get_num_gpus() == 0:
                raise RetrieverError("faiss_gpu=True needs a faiss build with GPU support and a visible GPU")
            options = faiss.GpuMultipleClonerOptions()
            options.useFloat16, options.shard = True, True
            self._index = faiss.index_cpu_to_all_gpus(self._index, co=options)
        self.encoder = QueryEncoder(model, name=encoder_name, pooling=pooling, max_length=max_length, fp16=fp16,
                                    device=device, query_prefix=query_prefix, normalize=normalize)  # fmt: skip
        dim = self.encoder.encode(["dimension probe"]).shape[1]
        if dim != self._index.d:
            raise RetrieverError(
                f"the query encoder {self.encoder.model_path!r} gives {dim}-d vectors but the index {index_path} "
                f"holds {self._index.d}-d ones: use the model it was built with"
            )

    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """Per query, the ``topk`` passages of highest inner product with its embedding, best first."""
        queries = check_search_args(queries, topk)
        if not queries:
            return []
        scores, ids = self._index.search(self.encoder.encode(queries), min(topk, len(self.passages)))
        return [
            [
                self.passages[int(j)].with_score(float(s))
                for j, s in zip(ids[i], scores[i], strict=True)
                if j >= 0
            ]
            for i in range(len(queries))
        ]

    def __repr__(self) -> str:
        return f"FaissIndexRetriever({self._index.ntotal} vectors, {len(self.passages)} passages, {self.encoder!r})"
