"""Query embeddings exactly as the Dr. MAS reference's retrieval server computes them for its e5 FAISS index.

The reference server (``langfengQ/DrMAS examples/search/retriever/retrieval_server.py``, the one its
``retrieval_launch.sh`` starts on the prebuilt ``e5_Flat.index`` of wiki-18) embeds a query with
``Encoder.encode`` (``:58-110``), configured at ``:372-383``:

* a Hugging Face ``AutoModel`` + fast ``AutoTokenizer`` (``:35-43``), in fp16 on the GPU (``use_fp16=True``,
  ``:381``);
* a prefix chosen by the retriever *name* (``--retriever_name e5``, not the model path): ``"query: "`` when it
  contains ``e5``, ``"Represent this sentence for searching relevant passages: "`` when it contains ``bge``
  (``:75-85``);
* tokenised with ``max_length=256`` (``:382``), ``padding=True``, ``truncation=True`` (``:87-89``);
* pooled by **mean** over the attention mask (``pooling_method="mean"``, ``:379``, ``:46-55``), or ``cls`` /
  ``pooler``; a T5 model takes its first decoder state (``:92-98``);
* L2-normalised unless the name contains ``dpr`` (``:104-105``), returned as float32 (``:107-108``).

:class:`QueryEncoder` does the same with the same defaults. Differences: the model is not loaded with
``trust_remote_code`` (pass a model that needs none, e.g. ``intfloat/e5-base-v2``); fp16 is the default on CUDA
only (``fp16=None``): on a CPU half precision is slow, and fp32 embeddings differ from the fp16 ones by rounding
(~1e-3), which can swap near-tied neighbours; pass ``fp16=True`` to match a GPU server bit for bit on the same
hardware.

torch and transformers are imported when an encoder is built, not when this module is imported.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from drmas_envs.search.retrievers.base import RetrieverError

__all__ = ["QueryEncoder", "POOLINGS", "query_prefix_for"]

#: Pooling methods of the reference's ``pooling`` (``retrieval_server.py:46-55``).
POOLINGS = ("mean", "cls", "pooler")

_BGE_PREFIX = "Represent this sentence for searching relevant passages: "


def query_prefix_for(name: str) -> str:
    """The query prefix the reference adds for a retriever called ``name`` (``retrieval_server.py:75-85``)."""
    lowered = name.lower()
    prefix = "query: " if "e5" in lowered else ""
    if "bge" in lowered:
        prefix = _BGE_PREFIX + prefix  # both apply, in this order, if a name holds both (never in practice)
    return prefix


class QueryEncoder:
    """Embed queries as the reference server does (module doc).

    Args:
        model: a local model directory or a Hub id (``intfloat/e5-base-v2``, the reference's).
        name: the retriever name that picks the prefix and normalisation, as the reference's ``--retriever_name``
            (default: ``"e5"`` when ``"e5"`` is in ``model``, else ``model``).
        pooling: ``"mean"`` (the reference's), ``"cls"`` or ``"pooler"``.
        max_length: query tokens kept (the reference's 256).
        fp16: half precision; ``None`` = on CUDA devices only.
        device: torch device (``"cpu"``, ``"cuda"``...).
        query_prefix / normalize: override what ``name`` implies.

    Raises:
        RetrieverError: torch/transformers missing, or the model cannot be loaded (names it).
        ValueError: an unknown ``pooling`` or ``max_length`` < 1.
    """

    def __init__(self, model: str | Path, *, name: str | None = None, pooling: str = "mean", max_length: int = 256,
                 fp16: bool | None = None, device: str = "cpu", query_prefix: str | None = None,
                 normalize: bool | None = None) -> None:  # fmt: skip
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"max_length must be an int >= 1, got {max_length!r}")
        try:
            import torch
            from transformers import AutoModel, AutoTokenizer
        except ImportError as e:
            raise RetrieverError(
                f"query encoding needs torch and transformers: pip install 'drmas[dense]' ({e})"
            ) from e
        self.model_path = str(model)
        self.name = (
            name if name is not None else ("e5" if "e5" in self.model_path.lower() else self.model_path)
        )
        self.pooling, self.max_length, self.device = pooling, max_length, device
        self.fp16 = str(device).startswith("cuda") if fp16 is None else bool(fp16)
        self.query_prefix = query_prefix_for(self.name) if query_prefix is None else query_prefix
        self.normalize = ("dpr" not in self.name.lower()) if normalize is None else bool(normalize)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_path, use_fast=True)
            net = AutoModel.from_pretrained(self.model_path)
        except (OSError, ValueError) as e:
            raise RetrieverError(f"cannot load the query encoder {self.model_path!r}: {e}") from e
        net.eval()
        net.to(device)
        self.model = net.half() if self.fp16 else net
        self._torch = torch
        self._lock = threading.Lock()  # one forward at a time: the server answers requests from a thread pool

    def encode(self, queries: Sequence[str]) -> np.ndarray:
        """``(len(queries), dim)`` float32, C-contiguous: the reference's ``Encoder.encode(queries, is_query=True)``."""
        torch = self._torch
        texts = [self.query_prefix + q for q in queries]
        with self._lock, torch.no_grad():
            inputs = self.tokenizer(texts, max_length=self.max_length, padding=True, truncation=True,
                                    return_tensors="pt")  # fmt: skip
            inputs = {k: v.to(self.device) for k, v in inputs.items()}
            if "T5" in type(self.model).__name__:
                start = torch.zeros(
                    (inputs["input_ids"].shape[0], 1), dtype=torch.long, device=inputs["input_ids"].device
                )
                emb = self.model(**inputs, decoder_input_ids=start, return_dict=True).last_hidden_state[
                    :, 0, :
                ]
            else:
                out = self.model(**inputs, return_dict=True)
                if self.pooling == "mean":
                    mask = inputs["attention_mask"]
                    hidden = out.last_hidden_state.masked_fill(~mask[..., None].bool(), 0.0)
                    emb = hidden.sum(dim=1) / mask.sum(dim=1)[..., None]
                elif self.pooling == "cls":
                    emb = out.last_hidden_state[:, 0]
                else:
                    emb = out.pooler_output
                if self.normalize:
                    emb = torch.nn.functional.normalize(emb, dim=-1)
        return emb.detach().cpu().numpy().astype(np.float32, order="C")

    def __repr__(self) -> str:
        return (
            f"QueryEncoder({self.model_path!r}, name={self.name!r}, pooling={self.pooling!r}, "
            f"max_length={self.max_length}, fp16={self.fp16}, device={self.device!r})"
        )
