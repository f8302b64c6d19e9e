"""Per-token log-probabilities (and entropies) of given responses under a causal LM, in one batched forward.

The same convention as every generation backend (:mod:`drmas_train.backends.base`):
``logprob[b, t] = log softmax(logits[b, t] / temperature)[response_ids[b][t]]`` (temperature 0 is taken as 1),
so recomputing the rollout's tokens with the same weights gives the rollout's ``old_logprobs`` (PPO ratio 1).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["forward_logprobs", "pack_prompt_response", "cache_kwarg"]


def cache_kwarg(model: Any) -> str:
    """Name of the KV-cache keyword of ``model.forward``: ``"cache"`` (transformers >= 5.2x) or ``"past_key_values"``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def pack_prompt_response(
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    pad_token_id: int,
    device: Any = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lay out B (prompt, response) pairs as one padded batch: prompts left-padded to P, responses right-padded to T.

    Returns:
        input_ids (B, P+T) long, attention_mask (B, P+T) long, position_ids (B, P+T) long (0 at each row's first
        real token), response_mask (B, T) float32 (1 on real response tokens).

    Raises:
        ValueError: different numbers of prompts and responses, or an empty prompt.
    """
    if len(prompt_ids) != len(response_ids):
        raise ValueError(
            f"got {len(prompt_ids)} prompts but {len(response_ids)} responses; they must pair up"
        )
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt must have at least one token (apply the chat template first)")
    batch = len(prompt_ids)
    prompt_len = max((len(p) for p in prompt_ids), default=0)
    resp_len = max((len(r) for r in response_ids), default=0)
    input_ids = torch.full((batch, prompt_len + resp_len), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, prompt_len + resp_len), dtype=torch.long)
    for b, (p, r) in enumerate(zip(prompt_ids, response_ids, strict=True)):
        input_ids[b, prompt_len - len(p) : prompt_len] = torch.as_tensor(list(p), dtype=torch.long)
        input_ids[b, prompt_len : prompt_len + len(r)] = torch.as_tensor(list(r), dtype=torch.long)
        attention_mask[b, prompt_len - len(p) : prompt_len + len(r)] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    response_mask = attention_mask[:, prompt_len:].to(torch.float32)
    return input_ids.to(device), attention_mask.to(device), position_ids.to(device), response_mask.to(device)


def forward_logprobs(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of ``response_ids`` given ``prompt_ids`` under ``model``, one forward for the batch.

    Gradients flow (call under ``torch.no_grad()`` for reference/old log-probs). Only the last T+1 positions'
    logits are computed (``logits_to_keep``), never the prompt's.

    Args:
        model: a causal LM (transformers ``PreTrainedModel`` or PEFT wrapper) on its device.
        prompt_ids: B prompts (token ids, chat template applied, each non-empty).
        response_ids: B responses (token ids, possibly empty).
        pad_token_id: id used for padding (masked out; any valid id works).
        temperature: the sampling temperature (0 = greedy, taken as 1).
        with_entropy: also return the entropy of the temperature-scaled distribution per position.

    Returns:
        ``(logprobs, response_mask, entropy)``: logprobs (B, T) float32, 0 on padding; response_mask (B, T)
        float32; entropy (B, T) float32 in nats (0 on padding) or None. T = longest response.

    Raises:
        ValueError: see :func:`pack_prompt_response`; a negative temperature.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy, scored at 1), got {temperature}")
    scale = float(temperature) if temperature > 0 else 1.0
    device = next(model.parameters()).device
    input_ids, attention_mask, position_ids, response_mask = pack_prompt_response(
        prompt_ids, response_ids, pad_token_id, device
    )
    batch, resp_len = response_mask.shape
    if resp_len == 0:
        empty = torch.zeros((batch, 0), dtype=torch.float32, device=device)
        return empty, response_mask, (empty.clone() if with_entropy else None)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
        logits_to_keep=resp_len + 1,
    )
    # position P-1+t predicts response token t: drop the last kept position.
    logits = out.logits[:, :-1, :].float() / scale  # (B, T, V)
    targets = input_ids[:, -resp_len:]  # (B, T)
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(
        logits, dim=-1
    )  # (B, T)
    logprobs = logprobs * response_mask
    entropy = None
    if with_entropy:
        logp_all = torch.log_softmax(logits, dim=-1)  # (B, T, V)
        entropy = -(logp_all.exp() * logp_all).sum(-1) * response_mask  # (B, T)
    return logprobs, response_mask, entropy
