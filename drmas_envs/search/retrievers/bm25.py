"""BM25 retrieval with bm25s (Lù, 2024, arXiv 2407.03618): sparse scoring, index cached on disk by corpus hash.

Scoring is Okapi BM25 (Robertson & Zaragoza, 2009) as implemented by bm25s (``method="lucene"``),
over lower-cased, English-stop-worded, Snowball-stemmed (PyStemmer) tokens of ``title + text``.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from drmas_envs.search.corpus import Passage, corpus_hash
from drmas_envs.search.retrievers.base import check_search_args, default_cache_dir

__all__ = ["BM25Retriever"]

log = logging.getLogger(__name__)


class BM25Retriever:
    """In-process BM25 over a list of passages.

    Args:
        passages: the corpus (unique ids).
        cache_dir: root of the on-disk index cache (``<cache_dir>/bm25/<corpus hash>-<params>``); ``None`` uses
            :func:`~drmas_envs.search.retrievers.base.default_cache_dir`; ``False`` disables the disk cache.
            The directory name contains the corpus content hash, so a changed corpus is re-indexed.
        k1, b: BM25 parameters.
        stemmer: a PyStemmer language (``"english"``) or ``None`` for no stemming.

    Raises:
        ValueError: an empty corpus, a corpus without any indexable token, or bad parameters.
    """

    name = "bm25"

    def __init__(
        self,
        passages: Sequence[Passage],
        *,
        cache_dir: str | Path | None | bool = None,
        k1: float = 1.5,
        b: float = 0.75,
        stemmer: str | None = "english",
    ) -> None:
        import bm25s

        # bm25s sets its own logger to DEBUG on import, so every index build would print "Building index from
        # tokens" through the application's handlers; give the decision back to them (inherit the root's level).
        logging.getLogger("bm25s").setLevel(logging.NOTSET)
        if not passages:
            raise ValueError("BM25Retriever needs a non-empty corpus")
        if not (k1 > 0 and 0 <= b <= 1):
            raise ValueError(f"BM25 needs k1 > 0 and 0 <= b <= 1, got k1={k1!r}, b={b!r}")
        self.passages = list(passages)
        self.corpus_hash = corpus_hash(self.passages)
        self._stemmer_name = stemmer
        self._stemmer = None
        if stemmer is not None:
            import Stemmer

            self._stemmer = Stemmer.Stemmer(stemmer)
        self._lock = threading.Lock()  # PyStemmer objects are not thread-safe
        params = {"k1": k1, "b": b, "stemmer": stemmer, "method": "lucene"}
        tag = f"{self.corpus_hash}-k1{k1}-b{b}-{stemmer or 'nostem'}"
        self.index_dir: Path | None = None
        if cache_dir is not False:
            root = default_cache_dir() if cache_dir in (None, True) else Path(cache_dir)
            self.index_dir = root / "bm25" / tag
        if self.index_dir is not None and (self.index_dir / "done.json").is_file():
            self._bm25 = bm25s.BM25.load(str(self.index_dir), show_progress=False)
            self.loaded_from_cache = True
        else:
            tokens = self._tokenize([f"{p.title} {p.text}" for p in self.passages])
            if not any(tokens):
                raise ValueError("BM25 corpus has no indexable token (every word is a stopword or shorter than 2 characters)")
            self._bm25 = bm25s.BM25(k1=k1, b=b, method="lucene")
            self._bm25.index(tokens, show_progress=False)
            self.loaded_from_cache = False
            if self.index_dir is not None:
                self._save(params)

    def _tokenize(self, texts: list[str]) -> list[list[str]]:
        import bm25s

        with self._lock:
            return bm25s.tokenize(texts, stopwords="en", stemmer=self._stemmer, return_ids=False, show_progress=False)

    def _save(self, params: dict) -> None:
        if self.index_dir is None:
            return
        try:
            self.index_dir.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=self.index_dir.parent, prefix=".tmp-"))
        except OSError as e:  # read-only or unwritable cache: keep the in-memory index
            log.warning("BM25 index not cached at %s: %s", self.index_dir, e)
            return
        try:
            self._bm25.save(str(tmp), show_progress=False)
            (tmp / "done.json").write_text(json.dumps({**params, "num_passages": len(self.passages)}))
            tmp.rename(self.index_dir)
        except OSError as e:  # another process won the race (the index is there anyway), or the disk is full
            log.debug("BM25 index not cached at %s: %s", self.index_dir, e)
            shutil.rmtree(tmp, ignore_errors=True)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """Per query, up to ``topk`` passages with BM25 score > 0, best first (ties by corpus order).

        Scores are bm25s' precomputed per-(token, doc) BM25 terms summed over the query tokens (repeated query
        tokens count again, as in bm25s); top-k selection is done here over the matching documents only.

        Raises:
            TypeError / ValueError: see :func:`~drmas_envs.search.retrievers.base.check_search_args`.
        """
        queries = check_search_args(queries, topk)
        if not queries:
            return []
        out = []
        for tokens in self._tokenize(queries):
            scores = self._scores(np.asarray(self._bm25.get_tokens_ids(tokens), dtype=np.int64))
            out.append([self.passages[int(d)].with_score(float(scores[d])) for d in _top_k(scores, topk)])
        return out

    def _scores(self, token_ids: np.ndarray) -> np.ndarray:
        """(num_passages,) float32 BM25 scores of one query (same sums as bm25s ``get_scores``)."""
        index = self._bm25.scores
        data, indices, indptr = index["data"], index["indices"], index["indptr"]
        scores = np.zeros(len(self.passages), dtype=np.float32)
        for t in token_ids:
            start, end = indptr[t], indptr[t + 1]
            # doc ids are unique within one token's posting list, so a fancy-index add is exact (and much faster
            # than bm25s' np.add.at)
            scores[indices[start:end]] += data[start:end]
        if self._bm25.nonoccurrence_array is not None and len(token_ids):  # BM25L / BM25+ variants only
            scores += self._bm25.nonoccurrence_array[token_ids].sum()
        return scores


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` highest positive scores, by decreasing score then increasing index (deterministic).

    One ``np.argpartition`` of the negated scores (partitioning for the top end of an array with many tied
    zeros is pathologically slow in NumPy); documents tied with the k-th score are all gathered so that ties
    break by corpus order rather than by partition order.
    """
    idx = np.argpartition(-scores, k - 1)[:k] if scores.size > k else np.arange(scores.size)
    kth = scores[idx].min() if idx.size else 0.0
    if kth > 0 and np.count_nonzero(scores >= kth) > k:
        idx = np.flatnonzero(scores >= kth)
    idx = idx[scores[idx] > 0]
    return idx[np.lexsort((idx, -scores[idx]))[:k]]
