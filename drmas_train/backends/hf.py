"""The ``hf`` backend: batched sampling with a transformers causal LM (CPU or GPU), the embedded default.

A hand-written token loop over a KV cache gives exact control of the log-probability convention
(:mod:`drmas_train.backends.base`): at each step ``logp = log_softmax(logits / temperature)`` is recorded for
the sampled token, and the token itself is drawn from the same scaled logits after top-k then top-p filtering
(the order of HF ``generate`` and vLLM). Prompts are left-padded so that every row's next token sits at the
last position; position ids count real tokens only, so padding never changes a row's result beyond float
rounding.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from drmas_train.backends.base import (
    Generation,
    Messages,
    SamplingParams,
    find_stop,
    render_chat,
    truncate_ids,
)
from drmas_train.logprobs import cache_kwarg

__all__ = ["HFBackend", "filter_logits", "sample_categorical"]


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
    """One draw per row from ``softmax(logits)`` by inverse-CDF sampling.

    ``torch.multinomial`` is several times slower on CPU for 10^5-token vocabularies; this costs one exp, one
    cumsum and a binary search per row. Tokens with probability 0 (logit ``-inf``) are never drawn.

    Args:
        logits: (B, V) float; ``-inf`` marks excluded tokens (at least one finite per row).
        generator: the random stream (one uniform draw per row).

    Returns:
        (B,) long token ids.
    """
    weights = torch.exp(logits - logits.max(dim=-1, keepdim=True).values)  # (B, V), max weight 1
    cdf = weights.cumsum(dim=-1)  # (B, V)
    u = torch.rand((logits.shape[0], 1), generator=generator, device=logits.device, dtype=cdf.dtype)
    u = u * cdf[:, -1:] * (1 - 1e-6)  # strictly below the total mass, so a positive-weight token is hit
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=logits.shape[-1] - 1)  # (B,)


class HFBackend:
    """Sample from a transformers causal LM.

    Args:
        model: a ``PreTrainedModel`` (or PEFT wrapper); the same object the trainer updates, so no weight sync
            is needed (:meth:`sync_weights` is a no-op).
        tokenizer: its tokenizer (chat template + pad token).
        chat_template_kwargs: passed to the chat template (e.g. ``{"enable_thinking": False}``).
        max_batch_size: rows (prompts x n) per forward; larger batches are split.
        seed: seeds this backend's own generator, used when ``SamplingParams.seed`` is None.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        max_batch_size: int = 64,
        seed: int = 0,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.max_batch_size = max_batch_size
        self._seeds = random.Random(seed)
        self._cache_kw = cache_kwarg(model)
        eos = {tokenizer.eos_token_id}
        for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
            value = getattr(source, "eos_token_id", None)
            eos.update(value if isinstance(value, (list, tuple)) else [value])
        self.eos_token_ids = frozenset(int(e) for e in eos if e is not None)
        self.pad_token_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )

    @classmethod
    def from_loaded(cls, loaded: Any, **kwargs: Any) -> HFBackend:
        """A backend over a :class:`drmas_train.models.LoadedModel` (uses its spec's ``chat_template_kwargs``)."""
        kwargs.setdefault("chat_template_kwargs", loaded.spec.chat_template_kwargs)
        return cls(loaded.model, loaded.tokenizer, **kwargs)

    def sync_weights(self, model: Any = None) -> None:
        """No-op: the backend samples from the very model object the trainer updates."""

    def encode_prompts(
        self, prompts: Sequence[Messages], *, max_prompt_tokens: int | None = None, truncation: str = "left"
    ) -> list[list[int]]:
        """Chat-template and tokenize each conversation, then truncate (:func:`truncate_ids`)."""
        return [
            truncate_ids(
                render_chat(self.tokenizer, m, self.chat_template_kwargs), max_prompt_tokens, truncation
            )
            for m in prompts
        ]

    def generate(
        self,
        prompts: Sequence[Messages],
        sampling: SamplingParams,
        *,
        max_prompt_tokens: int | None = None,
        truncation: str = "left",
    ) -> list[Generation]:
        """Sample ``sampling.n`` responses per conversation; ``len(prompts) * n`` results, prompt-major.

        Raises:
            PromptTooLongError: a prompt over ``max_prompt_tokens`` with ``truncation="error"``.
        """
        return self.generate_ids(
            self.encode_prompts(prompts, max_prompt_tokens=max_prompt_tokens, truncation=truncation), sampling
        )

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Generation]:
        """Like :meth:`generate` for prompts already tokenized (each non-empty)."""
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt must have at least one token")
        rows = [list(p) for p in prompt_ids for _ in range(sampling.n)]
        device = next(self.model.parameters()).device
        seed = sampling.seed if sampling.seed is not None else self._seeds.getrandbits(63)
        generator = torch.Generator(device=device).manual_seed(seed)
        was_training = self.model.training
        self.model.eval()
        try:
            out: list[Generation] = []
            for start in range(0, len(rows), self.max_batch_size):
                out.extend(
                    self._generate_batch(
                        rows[start : start + self.max_batch_size], sampling, generator, device
                    )
                )
        finally:
            self.model.train(was_training)
        return out

    @torch.no_grad()
    def _generate_batch(
        self, rows: list[list[int]], sampling: SamplingParams, generator: torch.Generator, device: Any
    ) -> list[Generation]:
        from transformers import DynamicCache

        batch, prompt_len = len(rows), max(len(r) for r in rows)
        input_ids = torch.full((batch, prompt_len), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((batch, prompt_len), dtype=torch.long)
        for b, r in enumerate(rows):
            input_ids[b, prompt_len - len(r) :] = torch.as_tensor(r)
            mask[b, prompt_len - len(r) :] = 1
        input_ids, mask = input_ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, P)
        cache = DynamicCache(config=getattr(self.model, "config", None))
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kw: cache},
        )
        logits = out.logits[:, -1, :].float()  # (B, V)
        next_pos = positions[:, -1:] + 1  # (B, 1)

        greedy = sampling.temperature == 0
        scale = 1.0 if greedy else float(sampling.temperature)
        max_stop = max((len(s) for s in sampling.stop), default=0)
        responses: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        reasons: list[str | None] = [None] * batch
        for step in range(sampling.max_new_tokens):
            scaled = logits / scale  # (B, V)
            if greedy:
                tokens = scaled.argmax(-1)  # (B,)
            else:
                if sampling.top_k != -1 or sampling.top_p < 1.0:
                    tokens = sample_categorical(
                        filter_logits(scaled, sampling.top_k, sampling.top_p), generator
                    )
                else:
                    tokens = sample_categorical(scaled, generator)  # (B,)
            # the same formula as drmas_train.logprobs.forward_logprobs: logit - logsumexp (unfiltered)
            token_lp = scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(
                scaled, dim=-1
            )  # (B,)
            token_list, lp_list = tokens.tolist(), token_lp.tolist()
            for b in range(batch):
                if reasons[b] is not None:
                    continue
                responses[b].append(token_list[b])
                logprobs[b].append(lp_list[b])
                if token_list[b] in self.eos_token_ids:
                    reasons[b] = "stop"
                elif max_stop:
                    # a stop string of L characters spans at most 4L byte-level tokens; decode only that tail,
                    # exactly as the final text is decoded (special tokens skipped)
                    tail = self.tokenizer.decode(
                        responses[b][-(4 * max_stop + 4) :], skip_special_tokens=True
                    )
                    if find_stop(tail, sampling.stop):
                        reasons[b] = "stop"
            if all(r is not None for r in reasons) or step == sampling.max_new_tokens - 1:
                break
            feed = torch.as_tensor(
                [token_list[b] if reasons[b] is None else self.pad_token_id for b in range(batch)],
                device=device,
            ).unsqueeze(-1)  # (B, 1)
            mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=device)], dim=-1)
            out = self.model(
                input_ids=feed,
                attention_mask=mask,
                position_ids=next_pos,
                use_cache=True,
                **{self._cache_kw: cache},
            )
            logits = out.logits[:, -1, :].float()
            next_pos = next_pos + 1
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
