"""Multi-turn search envs and their parts.

Floor 3 of drmas_envs (over ``core`` and ``data``; never ``math`` or ``games``).

* envs: :mod:`~drmas_envs.search.orchestrator` (``search-orchestrator-v0``), :mod:`~drmas_envs.search.search_r1`
  (``search-r1-v0``);
* retrieval: :mod:`~drmas_envs.search.retrievers` (``bm25``, ``dense``, ``faiss``, ``http``),
  :mod:`~drmas_envs.search.server`, :mod:`~drmas_envs.search.testing` (a stand-in of the reference's server);
* data: :mod:`~drmas_envs.search.corpus` (wiki-18 / HotpotQA corpora), :mod:`~drmas_envs.search.synthetic`
  (the offline default benchmark), :mod:`~drmas_envs.search.data` (QA loaders);
* scoring and parsing: :mod:`~drmas_envs.search.qa_metrics`, :mod:`~drmas_envs.search.parsing`.

Nothing here imports torch, fastapi or faiss at import time.
"""

from drmas_envs.search.corpus import Passage, hotpotqa_corpus, load_corpus_jsonl
from drmas_envs.search.data import load_qa_file, load_qa_hf
from drmas_envs.search.qa_metrics import exact_match, normalize_answer, qa_scores, sub_exact_match, token_f1
from drmas_envs.search.retrievers import Retriever, RetrieverError, RetrieverUnavailableError, make_retriever
from drmas_envs.search.synthetic import EncyclopediaConfig, generate_encyclopedia

__all__ = [
    "Passage",
    "hotpotqa_corpus",
    "load_corpus_jsonl",
    "load_qa_file",
    "load_qa_hf",
    "exact_match",
    "normalize_answer",
    "qa_scores",
    "sub_exact_match",
    "token_f1",
    "Retriever",
    "RetrieverError",
    "RetrieverUnavailableError",
    "make_retriever",
    "EncyclopediaConfig",
    "generate_encyclopedia",
]
