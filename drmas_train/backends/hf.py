"""The ``hf`` backend: batched sampling with a transformers causal LM (CPU or GPU), the embedded default.

A hand-written token loop over a KV cache gives exact control of the log-probability convention
(:mod:`drmas_train.backends.base`): at each step ``logp = log_softmax(logits / temperature)`` is recorded for
the sampled token, and the token itself is drawn from the same scaled logits after top-k then top-p filtering
(the order of HF ``generate`` and vLLM). Prompts are left-padded so that every row's next token sits at the
last position; position ids count real tokens only, so padding never changes a row's result beyond float
rounding.

Throughput (see ``benchmarks/perf/rollout_throughput.py``): equal prompts and prefixes shared within a batch are
prefilled once, the rest in length buckets (:mod:`drmas_train.model.prefill`); a row leaves the decode
batch as soon as it finishes; the next token is drawn with one pass for the softmax normaliser and a two-level
inverse CDF (:func:`sample_weights`) instead of a full-vocabulary cumulative sum.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import torch

from drmas_train.backends.base import (
    ChatTokenBackend,
    Generation,
    SamplingParams,
    eos_token_ids,
    find_stop,
)
from drmas_train.model.adapters import activate
from drmas_train.model.logprobs import cache_kwarg
from drmas_train.model.precision import AUTOCAST, AUTOCAST_MODES, forward_dtype
from drmas_train.model.prefill import can_stitch, prefill

__all__ = ["HFBackend", "TokenCallback", "filter_logits", "next_tokens", "sample_categorical", "sample_weights"]

#: ``on_tokens(rows, tokens)``: after each decode step, the output rows that got a token and the tokens (same length).
#: It may return rows to stop (a collection of output rows): they leave the decode batch at once with
#: ``finish_reason="abort"`` (vLLM's name for an aborted request), which is how a server drops a disconnected
#: client's rows; ``None`` (or empty) stops none.
TokenCallback = Callable[[list[int], list[int]], Collection[int] | None]


def _offset_rows(callback: TokenCallback, offset: int, rows: list[int], tokens: list[int]) -> list[int] | None:
    stopped = callback([offset + r for r in rows], tokens)
    return [r - offset for r in stopped] if stopped else None


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set to ``-inf`` the logits outside the top-k and then outside the top-p nucleus.

    Args:
        logits: (B, V) float, already temperature-scaled.
        top_k: keep the k largest per row; -1 = off.
        top_p: keep the smallest set of most likely tokens whose probability mass reaches ``top_p``; 1 = off.
            The most likely token is always kept.

    Returns:
        (B, V) float, a filtered copy.
    """
    out = logits.clone()
    if top_k > 0 and top_k < out.shape[-1]:
        kth = torch.topk(out, top_k, dim=-1).values[:, -1:]  # (B, 1)
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)  # (B, V)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = probs.cumsum(-1) - probs  # mass of strictly more likely tokens
        drop_sorted = mass_before >= top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def sample_categorical(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One draw per row from ``softmax(logits)`` (see :func:`sample_weights`).

    Args:
        logits: (B, V) float; ``-inf`` marks excluded tokens (at least one finite per row).
        generator: the random stream (one uniform draw per row).

    Returns:
        (B,) long token ids.
    """
    return sample_weights(torch.exp(logits - logits.amax(dim=-1, keepdim=True)), generator)


def sample_weights(weights: torch.Tensor, generator: torch.Generator, block: int = 1024) -> torch.Tensor:
    """One draw per row, token ``j`` with probability ``weights[j] / weights.sum()``, by two-level inverse CDF.

    A cumulative sum over a 10^5-token vocabulary is a slow sequential scan on CPU (and ``torch.multinomial``
    slower still), so the uniform draw first picks a block of ``block`` tokens from the cumulative block sums,
    then a token from the cumulative sum of that block only. Zero weights are never drawn.

    Args:
        weights: (B, V) float, non-negative, at least one positive and a finite sum per row (e.g.
            ``exp(logits - max)``, whose sum is between 1 and V).
        generator: the random stream (one uniform draw per row).
        block: tokens per block (>= 1).

    Returns:
        (B,) long token ids.
    """
    return _draw(weights, generator, block)[0]


def _draw(weights: torch.Tensor, generator: torch.Generator, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sample_weights`, also returning each row's total weight (B,) (the last block CDF value)."""
    rows, vocab = weights.shape
    full = vocab // block
    sums = [weights[:, : full * block].view(rows, full, block).sum(-1)] if full else []
    if full * block < vocab:
        sums.append(weights[:, full * block :].sum(-1, keepdim=True))
    block_sums = torch.cat(sums, dim=-1)  # (B, n_blocks)
    block_cdf = block_sums.cumsum(-1)
    u = torch.rand((rows, 1), generator=generator, device=weights.device, dtype=block_cdf.dtype)
    u = u * block_cdf[:, -1:] * (1 - 1e-6)  # below the total mass
    # rounding can still put u at (or past) a row's total: then its last positive block / token, never past
    chosen = torch.searchsorted(block_cdf, u, right=True).minimum(_last_positive(block_sums))  # (B, 1)
    before = torch.where(chosen > 0, block_cdf.gather(-1, (chosen - 1).clamp(min=0)), torch.zeros_like(u))
    cols = chosen * block + torch.arange(block, device=weights.device)  # (B, block)
    in_block = weights.gather(-1, cols.clamp(max=vocab - 1)) * (cols < vocab)
    offset = torch.searchsorted(in_block.cumsum(-1), u - before, right=True).minimum(_last_positive(in_block))
    return (chosen * block + offset).squeeze(-1), block_cdf[:, -1]


def _last_positive(values: torch.Tensor) -> torch.Tensor:
    """(B, 1) long: index of the last positive entry of each row of (B, K) ``values`` (0 if none)."""
    index = torch.arange(values.shape[-1], device=values.device)
    return torch.where(values > 0, index, 0).amax(-1, keepdim=True)


def next_tokens(
    logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw the next token of every row and its log-probability under the backend convention.

    ``logp = logit/T - logsumexp(logits/T)`` over the unfiltered distribution (T = 1 when greedy), the formula of
    :func:`drmas_train.model.logprobs.forward_logprobs`; the token comes from the top-k/top-p filtered distribution.
    It is computed as ``log(w[token]) - log(sum(w))`` with ``w = exp(logits/T - max)``, exact to ~1e-7 for every
    token of probability above ~1e-38 (float32's normal range), i.e. every token that is ever drawn in practice.

    Args:
        logits: (B, V) float32 raw next-token logits; **overwritten** (the caller's buffer is reused to avoid
            allocating B x V floats per step).
        sampling: temperature, top_k, top_p.
        generator: random stream for the draws.

    Returns:
        tokens (B,) long and their log-probabilities (B,) float32.
    """
    greedy = sampling.temperature == 0
    filtered = not greedy and (sampling.top_k != -1 or sampling.top_p < 1.0)
    if not greedy and sampling.temperature != 1:
        logits.div_(float(sampling.temperature))
    tokens = logits.argmax(-1) if greedy else None
    dropped = filter_logits(logits, sampling.top_k, sampling.top_p) == float("-inf") if filtered else None
    weights = logits.sub_(logits.amax(dim=-1, keepdim=True)).exp_()  # (B, V), max weight 1, in place
    if tokens is not None:
        total = weights.sum(-1)
    elif dropped is not None:
        total = weights.sum(-1)  # the normaliser is over the unfiltered distribution
        weights.masked_fill_(dropped, 0.0)  # a drawn token is never dropped, so it keeps its weight
        tokens = sample_weights(weights, generator)
    else:
        tokens, total = _draw(weights, generator, 1024)
    token_weight = weights.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (B,)
    return tokens, token_weight.log() - total.log()


class HFBackend(ChatTokenBackend):
    """Sample from a transformers causal LM.

    Args:
        model: a ``PreTrainedModel`` (or PEFT wrapper); the same object the trainer updates, so no weight sync
            is needed (:meth:`sync_weights` is a no-op).
        tokenizer: its tokenizer (chat template + pad token).
        chat_template_kwargs: passed to the chat template (e.g. ``{"enable_thinking": False}``).
        max_batch_size: rows (prompts x n) decoded together; larger batches are split.
        prefill_token_budget: most prompt tokens (padding included) per prefill forward; bounds activation memory.
        seed: seeds this backend's own generator, used when ``SamplingParams.seed`` is None.
        autocast: ``off`` | ``bf16`` | ``auto``: the compute dtype of a float32 model's decoding
            (:func:`drmas_train.model.precision.resolve_autocast`); a model marked to compute in bf16 over float32
            master weights decodes in bf16 whatever this says (:func:`~drmas_train.model.precision.forward_dtype`).

    Raises:
        ValueError: ``max_batch_size`` or ``prefill_token_budget`` below 1, or an unknown ``autocast``.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        max_batch_size: int = 64,
        prefill_token_budget: int = 8192,
        seed: int = 0,
        autocast: str = AUTOCAST,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if prefill_token_budget < 1:
            raise ValueError(f"prefill_token_budget must be >= 1, got {prefill_token_budget}")
        self.model = model
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.max_batch_size = max_batch_size
        self.prefill_token_budget = prefill_token_budget
        if autocast not in AUTOCAST_MODES:
            raise ValueError(f"autocast must be one of {list(AUTOCAST_MODES)}, got {autocast!r}")
        self.autocast = autocast
        self._stitch = can_stitch(model)
        #: running totals since construction: ``prompt_tokens`` (real prompt tokens of all rows),
        #: ``prefill_tokens`` (tokens actually fed in prefill forwards, padding included), ``prefill_forwards``,
        #: ``decode_forwards``, ``generated_tokens``. Benchmarks read them; reset by assigning a new Counter.
        self.counters: Counter[str] = Counter()
        self._special_ids = frozenset(getattr(tokenizer, "all_special_ids", ()) or ())
        self._seeds = random.Random(seed)
        self._cache_kw = cache_kwarg(model)
        self.eos_token_ids = eos_token_ids(tokenizer, model)
        self.pad_token_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        #: called before each batched call (:meth:`from_loaded` sets it for an adapter on a shared base)
        self.before_generate: Callable[[], None] = lambda: None

    @classmethod
    def from_loaded(cls, loaded: Any, **kwargs: Any) -> HFBackend:
        """A backend over a :class:`drmas_train.model.models.LoadedModel` (uses its spec's ``chat_template_kwargs``);
        a LoRA adapter on a shared base (``spec.adapter``) is activated before each batched call
        (:func:`drmas_train.model.adapters.activate`)."""
        kwargs.setdefault("chat_template_kwargs", loaded.spec.chat_template_kwargs)
        backend = cls(loaded.model, loaded.tokenizer, **kwargs)
        if getattr(loaded.spec, "adapter", None) is not None:
            backend.before_generate = functools.partial(activate, loaded)
        return backend

    def sync_weights(self, model: Any = None) -> None:
        """No-op: the backend samples from the very model object the trainer updates."""

    def generate_ids(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams,
        *,
        on_tokens: TokenCallback | None = None,
    ) -> list[Generation]:
        """Like :meth:`generate` for prompts already tokenized (each non-empty)."""
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt must have at least one token")
        rows = [list(p) for p in prompt_ids for _ in range(sampling.n)]
        self.before_generate()  # e.g. this backend's LoRA adapter on a base other backends share
        device = next(self.model.parameters()).device
        seed = sampling.seed if sampling.seed is not None else self._seeds.getrandbits(63)
        generator = torch.Generator(device=device).manual_seed(seed)
        was_training = self.model.training
        self.model.eval()
        dtype = forward_dtype(self.autocast, self.model)  # bf16 over float32 masters, or optim.autocast's choice
        try:
            # one autocast region for the whole call: each weight is cast once (autocast caches casts of leaf
            # parameters until the region ends), not once per decode step
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                out = self._generate_rows(rows, sampling, generator, device, on_tokens)
        finally:
            self.model.train(was_training)
        return out

    def _generate_rows(self, rows: list[list[int]], sampling: SamplingParams, generator: torch.Generator, device: Any,
                       on_tokens: TokenCallback | None) -> list[Generation]:  # fmt: skip
        """:meth:`_generate_batch` over ``rows`` in slices of ``max_batch_size``."""
        out: list[Generation] = []
        for start in range(0, len(rows), self.max_batch_size):
            step_cb = None if on_tokens is None else functools.partial(_offset_rows, on_tokens, start)
            out.extend(self._generate_batch(rows[start : start + self.max_batch_size], sampling, generator, device,
                                            step_cb))  # fmt: skip
        return out

    @torch.no_grad()
    def _generate_batch(
        self,
        rows: list[list[int]],
        sampling: SamplingParams,
        generator: torch.Generator,
        device: Any,
        on_tokens: TokenCallback | None = None,
    ) -> list[Generation]:
        state = prefill(
            self.model,
            self._cache_kw,
            rows,
            pad_token_id=self.pad_token_id,
            device=device,
            token_budget=self.prefill_token_budget,
            stitch=self._stitch,
            reserve=sampling.max_new_tokens,
        )
        cache, mask, next_pos, logits = state.cache, state.attention_mask, state.next_positions, state.logits
        batch = len(rows)
        self.counters.update(
            prompt_tokens=sum(map(len, rows)),
            prefill_tokens=state.prefill_tokens,
            prefill_forwards=state.forwards,
        )
        max_stop = max((len(s) for s in sampling.stop), default=0)
        responses: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        reasons: list[str | None] = [None] * batch
        visible: list[list[int]] = [[] for _ in range(batch)]  # response tokens that are not special tokens
        live = list(range(batch))  # input row of each batch row; finished rows leave the batch
        for step in range(sampling.max_new_tokens):
            tokens, token_lp = next_tokens(logits, sampling, generator)  # (b,), (b,)
            token_list, lp_list = tokens.tolist(), token_lp.tolist()
            stopped = on_tokens(list(live), token_list) if on_tokens is not None else None
            for j, b in enumerate(live):
                token = token_list[j]
                responses[b].append(token)
                logprobs[b].append(lp_list[j])
                if stopped and b in stopped:  # the caller dropped this row (e.g. its client disconnected)
                    reasons[b] = "abort"
                elif token in self.eos_token_ids:
                    reasons[b] = "stop"
                elif max_stop and token not in self._special_ids:
                    # a stop string of L characters spans at most 4L byte-level tokens of visible text; decode
                    # only that tail, exactly as the final text is decoded (special tokens, which decode to
                    # nothing and could push a stop string out of the window, are left out)
                    visible[b].append(token)
                    tail = self.tokenizer.decode(visible[b][-(4 * max_stop + 4) :], skip_special_tokens=True)
                    if find_stop(tail, sampling.stop):
                        reasons[b] = "stop"
            keep = [j for j, b in enumerate(live) if reasons[b] is None]
            if not keep or step == sampling.max_new_tokens - 1:
                break
            if len(keep) < len(live):  # drop finished rows: later steps cost only the live ones
                index = torch.as_tensor(keep, device=device)
                cache.batch_select_indices(index)
                mask, next_pos, tokens = mask[index], next_pos[index], tokens[index]
                live = [live[j] for j in keep]
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=-1)
            self.counters["decode_forwards"] += 1
            out = self.model(
                input_ids=tokens.unsqueeze(-1),
                attention_mask=mask,
                position_ids=next_pos,
                use_cache=True,
                **{self._cache_kw: cache},
            )
            logits = out.logits[:, -1, :].float()
            next_pos = next_pos + 1
        self.counters["generated_tokens"] += sum(map(len, responses))
        return [
            Generation(
                text=self.tokenizer.decode(responses[b], skip_special_tokens=True),
                prompt_ids=rows[b],
                response_ids=responses[b],
                logprobs=logprobs[b],
                finish_reason=reasons[b] or "length",  # type: ignore[arg-type]
            )
            for b in range(batch)
        ]
