"""Batched prompt prefill for the ``hf`` backend, without paying twice for shared tokens or for padding.

A lock-step rollout sends each model one batch of prompts per step, and those prompts overlap: the G rollouts of
a task open with the *same* prompt, later turns of a group share the system prompt and the question, and every
prompt of an agent starts with the same template. On a CPU (and for long prompts on a GPU) the prefill is
compute-bound, so a naive left-padded batch costs more than prefilling the prompts one by one. :func:`prefill`

1. computes each distinct prompt once (rows repeating it share its key/value cache and next-token logits);
2. splits the distinct prompts into a radix tree (:func:`prompt_tree`): a run of tokens several prompts share
   is computed once, and each prompt's remainder is computed on top of a copy of its shared context;
3. runs the segments of one tree level in length buckets (:func:`length_buckets`), so padding stays within a
   bounded share of each forward and no forward exceeds a token budget;
4. gathers each row's keys/values into one left-padded batch for decoding: row ``r``'s states sit at the right
   end of the time axis, the attention mask is 0 on the padding, positions count real tokens only;
5. keeps that batch in buffers with room for the tokens still to come (:class:`ReservedKVLayer`), so a decode
   step writes one position instead of copying the whole cache (``DynamicCache`` concatenates: at 64 rows x
   300 positions that copy cost as much as the model's matmuls).

These are the ideas of vLLM's automatic prefix caching (SGLang's RadixAttention) and of length bucketing,
reduced to one batch. The result is exact up to float rounding: every real token attends to exactly the tokens
it would in an unpadded forward, at the same positions. Caches whose layers are not plain full-attention
``DynamicLayer`` s (sliding windows, hybrid or quantised caches) cannot be stitched; for them :func:`prefill`
runs one left-padded forward over the distinct prompts and repeats rows with ``Cache.batch_select_indices``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from drmas_train.model.token_budget import pack_by_token_budget

__all__ = [
    "Prefilled",
    "ReservedKVLayer",
    "Segment",
    "can_stitch",
    "length_buckets",
    "prefill",
    "prompt_tree",
    "reserved_cache",
]


@dataclasses.dataclass
class Prefilled:
    """The state after the prompts of a batch: what the decode loop continues from.

    Attributes:
        cache: a transformers ``Cache`` holding B rows (the input rows, duplicates included, in order).
        attention_mask: (B, L) long, 1 on real prompt tokens, 0 on padding; L = the cache's length.
        next_positions: (B, 1) long, position id of each row's next token (its number of real tokens).
        logits: (B, V) float32, next-token logits after each row's last prompt token.
        forwards: number of model forward calls spent (for benchmarks and tests).
        prefill_tokens: tokens fed to the model, padding included (for benchmarks and tests).
    """

    cache: Any
    attention_mask: torch.Tensor
    next_positions: torch.Tensor
    logits: torch.Tensor
    forwards: int = 0
    prefill_tokens: int = 0


class ReservedKVLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys/values are views into buffers with spare positions.

    ``update`` writes the new positions into the buffers (growing them by doubling when full) and returns views
    of the filled part, so a decode step costs O(new positions) instead of ``torch.cat``'s O(cache). Only what
    the decode loop uses is supported: ``update``, ``batch_select_indices`` and the read-only queries; the
    other reshaping methods raise ``NotImplementedError``.

    Args:
        key_buffer, value_buffer: (B, H_kv, C, D) buffers, owned by the layer from now on; positions
            ``[0, length)`` hold the cached states, ``[length, C)`` is room for new ones.
        length: filled positions, 0 <= length <= C.
    """

    def __init__(self, key_buffer: torch.Tensor, value_buffer: torch.Tensor, length: int) -> None:
        super().__init__()
        self.lazy_initialization(key_buffer, value_buffer)
        self._key_buf, self._value_buf, self._length = key_buffer, value_buffer, length
        self._expose()

    def _expose(self) -> None:
        self.keys = self._key_buf[:, :, : self._length]
        self.values = self._value_buf[:, :, : self._length]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (B, H_kv, q, D) states; returns the (B, H_kv, length + q, D) views of all positions."""
        end = self._length + key_states.shape[-2]
        if end > self._key_buf.shape[-2]:
            capacity = max(end, 2 * self._key_buf.shape[-2])
            for name in ("_key_buf", "_value_buf"):
                old = getattr(self, name)
                new = old.new_empty((*old.shape[:2], capacity, old.shape[3]))
                new[:, :, : self._length] = old[:, :, : self._length]
                setattr(self, name, new)
        self._key_buf[:, :, self._length : end] = key_states
        self._value_buf[:, :, self._length : end] = value_states
        self._length = end
        self._expose()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the rows ``indices`` (1-D long)."""
        self._key_buf, self._value_buf = self._key_buf[indices], self._value_buf[indices]
        self._expose()

    def _unsupported(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} supports update and batch_select_indices only")

    crop = batch_repeat_interleave = reorder_cache = reset = _unsupported


def reserved_cache(layers: Sequence[tuple[torch.Tensor, torch.Tensor]], length: int) -> Any:
    """A ``DynamicCache`` over :class:`ReservedKVLayer` s built from per-layer (key, value) buffers."""
    from transformers import DynamicCache

    cache = DynamicCache(ddp_cache_data=[(None, None)] * len(layers))  # empty DynamicLayers, replaced now
    cache.layers = [ReservedKVLayer(k, v, length) for k, v in layers]
    return cache


def length_buckets(lengths: Sequence[int], *, token_budget: int, max_pad_fraction: float) -> list[list[int]]:
    """Group sequence indices into forward batches of similar length.

    Indices are taken longest first; a bucket takes the next index while its padded size
    ``len(bucket) * longest`` stays within ``token_budget`` and the newcomer is at most ``max_pad_fraction`` of
    the bucket's longest length shorter than it. A sequence longer than the budget gets a bucket of its own.

    Args:
        lengths: token count of each sequence (>= 1).
        token_budget: most tokens (padding included) per forward, >= 1.
        max_pad_fraction: in [0, 1); 0 = only equal lengths share a bucket.

    Returns:
        Lists of indices into ``lengths``; every index appears exactly once; within a bucket, longest first.

    Raises:
        ValueError: ``token_budget < 1`` or ``max_pad_fraction`` outside [0, 1).
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    if not 0 <= max_pad_fraction < 1:
        raise ValueError(f"max_pad_fraction must be in [0, 1), got {max_pad_fraction}")
    return pack_by_token_budget(lengths, token_budget, longest_first=True, max_pad_fraction=max_pad_fraction)


def can_stitch(model: Any) -> bool:
    """True when the model's cache is made of plain full-attention ``DynamicLayer`` s (see the module docstring)."""
    from transformers import DynamicCache

    config = getattr(model, "config", None)
    try:
        layers = DynamicCache(config=config).layers if config is not None else []
    except Exception:  # an unusual config: take the safe path
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def _right_aligned(seqs: Sequence[Sequence[int]], fill: int = 0) -> torch.Tensor:
    """(B, max length) long: each sequence right-aligned, ``fill`` before it (0 is the store's padding row)."""
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), fill, dtype=torch.long)
    for b, s in enumerate(seqs):
        if len(s):
            out[b, width - len(s) :] = torch.as_tensor(list(s), dtype=torch.long)
    return out


def _left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) long ids and (B, L) long mask of left-padded sequences."""
    ids = _right_aligned(seqs, pad_id)
    lengths = torch.as_tensor([len(s) for s in seqs]).unsqueeze(-1)
    return ids, (torch.arange(ids.shape[1]) >= ids.shape[1] - lengths).long()


@torch.no_grad()
def prefill(
    model: Any,
    cache_kw: str,
    rows: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    device: Any,
    token_budget: int = 8192,
    max_pad_fraction: float = 0.125,
    min_shared_prefix: int = 32,
    stitch: bool | None = None,
    reserve: int = 0,
) -> Prefilled:
    """Run the prompts of a batch through ``model`` and return the state to decode from.

    Args:
        model: a transformers causal LM in eval mode.
        cache_kw: its cache keyword (:func:`drmas_train.model.logprobs.cache_kwarg`).
        rows: B prompts as token ids (each non-empty); equal prompts are computed once.
        pad_token_id: id placed on padding (masked out, its value never matters).
        device: where the model lives.
        token_budget: most tokens per forward, padding included (bounds activation memory); the padded fallback
            runs all distinct prompts in one forward and ignores it.
        max_pad_fraction: padding allowed within a length bucket (:func:`length_buckets`).
        min_shared_prefix: shortest run of tokens shared by several prompts that is computed once
            (:func:`prompt_tree`); shorter shared runs are recomputed per prompt.
        stitch: force (True) or forbid (False) the stitched path; None = :func:`can_stitch`.
        reserve: positions to reserve in the stitched cache for the tokens to be generated
            (:class:`ReservedKVLayer`); the cache still grows past it if needed.

    Returns:
        :class:`Prefilled` for the B rows, in order.

    Raises:
        ValueError: no rows, or an empty row.
    """
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError(
            f"prefill needs at least one row and no empty row, got lengths {[len(r) for r in rows]}"
        )
    distinct: dict[tuple[int, ...], int] = {}
    row_to_unique = [distinct.setdefault(tuple(r), len(distinct)) for r in rows]
    unique = [list(u) for u in distinct]
    if stitch is None:
        stitch = can_stitch(model)
    if not stitch:
        return _padded_prefill(model, cache_kw, unique, row_to_unique, pad_token_id, device)
    return _tree_prefill(
        model,
        cache_kw,
        unique,
        row_to_unique,
        pad_token_id,
        device,
        token_budget=token_budget,
        max_pad_fraction=max_pad_fraction,
        min_shared=min_shared_prefix,
        reserve=reserve,
    )


def _padded_prefill(
    model: Any,
    cache_kw: str,
    unique: list[list[int]],
    row_to_unique: list[int],
    pad_token_id: int,
    device: Any,
) -> Prefilled:
    """The fallback of :func:`prefill`: one left-padded forward over the distinct prompts, rows repeated after."""
    ids, mask = _left_pad(unique, pad_token_id)
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = _fresh_cache(model)
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,
        **{cache_kw: cache},
    )
    expand = torch.as_tensor(row_to_unique, dtype=torch.long, device=device)
    if len(unique) != len(row_to_unique):
        cache.batch_select_indices(expand)
    return Prefilled(
        cache,
        mask[expand],
        (positions[:, -1:] + 1)[expand],
        out.logits[:, -1, :].float()[expand],
        forwards=1,
        prefill_tokens=ids.numel(),
    )


@dataclasses.dataclass
class Segment:
    """A node of the prompt tree: tokens ``[start, end)`` of distinct prompt ``prompt``.

    Its context is the chain of parent segments (tokens ``[0, start)``); ``leaf`` is the index of the distinct
    prompt it ends, or -1 for a shared (internal) segment; ``depth`` counts its ancestors.
    """

    prompt: int
    start: int
    end: int
    parent: int
    depth: int
    leaf: int = -1


def prompt_tree(prompts: Sequence[Sequence[int]], min_shared: int) -> list[Segment]:
    """Split distinct prompts into a radix tree of segments, each computed once by :func:`prefill`.

    A run of at least ``min_shared`` tokens that several prompts share (from where their shared context ends)
    becomes one internal segment; every prompt ends in a leaf segment of at least one token of its own, so its
    next-token logits come from its own forward row. Shorter shared runs are recomputed in each child.

    Args:
        prompts: distinct non-empty token-id sequences.
        min_shared: shortest shared run worth a segment of its own (>= 1).

    Returns:
        Segments, parents before children; every prompt is the ``leaf`` of exactly one.

    Raises:
        ValueError: ``min_shared < 1``.
    """
    if min_shared < 1:
        raise ValueError(f"min_shared must be >= 1, got {min_shared}")
    segments: list[Segment] = []
    # depth-first with an explicit stack (a batch of 10^3 nested prompts would exceed Python's recursion limit);
    # an entry is (prompt group, where its next segment starts, where its common run starts, parent, depth)
    stack: list[tuple[list[int], int, int, int, int]] = [(list(range(len(prompts))), 0, 0, -1, 0)]
    while stack:
        group, seg_start, scan, parent, depth = stack.pop()
        if len(group) == 1:
            segments.append(Segment(group[0], seg_start, len(prompts[group[0]]), parent, depth, group[0]))
            continue
        first, shortest = prompts[group[0]], min(len(prompts[i]) for i in group)
        end = scan
        while end < shortest and all(prompts[i][end] == first[end] for i in group):
            end += 1
        end = min(end, shortest - 1)  # every prompt keeps a token of its own
        if end - seg_start >= min_shared:
            segments.append(Segment(group[0], seg_start, end, parent, depth))
            parent, depth, seg_start = len(segments) - 1, depth + 1, end
        children: dict[int, list[int]] = {}
        for i in group:
            if len(prompts[i]) == end + 1:
                segments.append(Segment(i, seg_start, end + 1, parent, depth, i))
            else:
                children.setdefault(prompts[i][end], []).append(i)
        stack.extend((child, seg_start, end, parent, depth) for child in reversed(children.values()))
    return segments


def _tree_prefill(
    model: Any,
    cache_kw: str,
    unique: list[list[int]],
    row_to_unique: list[int],
    pad_token_id: int,
    device: Any,
    *,
    token_budget: int,
    max_pad_fraction: float,
    min_shared: int,
    reserve: int,
) -> Prefilled:
    """The stitched path of :func:`prefill`: tree segments level by level, then one gather into the decode cache.

    Every computed key/value position is kept once in a flat per-layer store of shape (N + 1, H_kv, D), row 0
    being zeros for padding; a segment's context and, at the end, each row's whole prompt are gathered from it
    by index.
    """
    segments = prompt_tree(unique, max(1, min_shared))
    spans: list[list[int]] = [[] for _ in segments]  # store rows of each segment's context + own tokens
    store: list[list[torch.Tensor]] = []  # per layer [keys (N + 1, H, D), values (N + 1, H, D)]
    stored = 1  # rows in the store, the padding row included
    leaf_logits: dict[int, torch.Tensor] = {}
    forwards = tokens = 0
    for depth in range(max(seg.depth for seg in segments) + 1):
        level = [i for i, seg in enumerate(segments) if seg.depth == depth]
        computed: list[list[list[torch.Tensor]]] = []  # per layer [[key chunks], [value chunks]]
        for bucket in length_buckets(
            [segments[i].end - segments[i].start for i in level],
            token_budget=token_budget,
            max_pad_fraction=max_pad_fraction,
        ):
            members = [segments[level[j]] for j in bucket]
            ids, seg_mask = _left_pad([unique[m.prompt][m.start : m.end] for m in members], pad_token_id)
            ids, seg_mask = ids.to(device), seg_mask.to(device)
            context = _right_aligned([spans[m.parent] if m.start else [] for m in members]).to(device)
            ctx_width = context.shape[1]
            if store:
                cache = reserved_cache(_gather(store, context, ctx_width + ids.shape[1]), ctx_width)
            else:  # the first level has no context
                cache = _fresh_cache(model)
            starts = torch.as_tensor([m.start for m in members], device=device).unsqueeze(-1)
            out = model(
                input_ids=ids,
                attention_mask=torch.cat([(context > 0).long(), seg_mask], dim=-1),
                position_ids=starts + (seg_mask.cumsum(-1) - 1).clamp(min=0),
                use_cache=True,
                logits_to_keep=1,
                **{cache_kw: cache},
            )
            forwards, tokens = forwards + 1, tokens + ids.numel()
            real = seg_mask.bool()  # (nb, seg_width)
            for layer, (k, v, *_) in enumerate(cache):
                if layer == len(computed):
                    computed.append([[], []])
                for chunks, states in zip(computed[layer], (k, v), strict=True):
                    chunks.append(states[:, :, ctx_width:].transpose(1, 2)[real])  # (sum of lengths, H, D)
            for b, m in enumerate(members):
                own = list(range(stored, stored + m.end - m.start))
                stored += len(own)
                spans[level[bucket[b]]] = (spans[m.parent] if m.start else []) + own
                if m.leaf >= 0:
                    leaf_logits[m.leaf] = out.logits[b, -1, :].float()
        if not store:
            store = [[chunks[0][:1] * 0 for chunks in kv] for kv in computed]  # the padding row
        store = [
            [torch.cat([old, *chunks]) for old, chunks in zip(kv_store, kv_new, strict=True)]
            for kv_store, kv_new in zip(store, computed, strict=True)
        ]

    leaf_span = {seg.leaf: spans[i] for i, seg in enumerate(segments) if seg.leaf >= 0}
    index = _right_aligned([leaf_span[u] for u in row_to_unique]).to(device)
    width = index.shape[1]
    return Prefilled(
        reserved_cache(_gather(store, index, width + reserve), width),
        (index > 0).long(),
        (index > 0).sum(-1, keepdim=True),
        torch.stack([leaf_logits[u] for u in row_to_unique]),
        forwards=forwards,
        prefill_tokens=tokens,
    )


def _gather(
    store: list[list[torch.Tensor]], index: torch.Tensor, capacity: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, (B, H, capacity, D) key and value buffers whose first W positions are the store rows ``index``
    (B, W); the rest is uninitialised room for :class:`ReservedKVLayer`."""
    layers = []
    for kv in store:
        pair = []
        for flat in kv:  # (N + 1, H, D)
            buf = flat.new_empty((index.shape[0], flat.shape[1], capacity, flat.shape[2]))
            buf[:, :, : index.shape[1]] = flat[index].transpose(1, 2)
            pair.append(buf)
        layers.append((pair[0], pair[1]))
    return layers


def _fresh_cache(model: Any) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=getattr(model, "config", None))
