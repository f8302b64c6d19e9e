"""Per-token log-probabilities (and entropies) of given responses under a causal LM, in one batched forward.

The same convention as every generation backend (:mod:`drmas_train.backends.base`):
``logprob[b, t] = log softmax(logits[b, t] / temperature)[response_ids[b][t]]`` (temperature 0 is taken as 1),
so recomputing the rollout's tokens with the same weights gives the rollout's ``old_logprobs`` (PPO ratio 1).

Two savings over a plain ``model(...).logits`` forward, both exact up to float rounding (docs/update-performance.md):

* **chunked LM head** (``lm_head_chunk``): the decoder's hidden states are taken at the response positions only
  and scored by :func:`drmas_train.model.lm_head.chunked_token_logprobs`, so no (B, T, V) tensor and no full-vocabulary
  autograd graph is ever built. Used when the model's head is a plain ``nn.Linear`` after the decoder
  (:func:`split_lm_head`); other models (logit soft-capping or scaling, a LoRA-wrapped head) take the plain path.
* **shared prompts** (``share_prompts``): rows with the same prompt (the G rollouts of a group) compute it once:
  the distinct prompts but their last token run in one forward whose key/value cache, with its autograd graph,
  is repeated for the rows, and each row runs ``[last prompt token] + response[:-1]`` on top of it. Gradients
  reach the shared prompt through the cache (summed over the rows, as in the unshared forward). This is the
  update-side twin of the rollout's prefix sharing (:mod:`drmas_train.model.prefill`).

**Wrappers.** A model trained by several processes at once sits inside a wrapper whose forward hooks must run
around every use of its parameters (gradient synchronisation, gathering sharded weights). The lean path calls the
decoder and the LM head directly, which would bypass them; so the caller passes a :class:`Forward` that says how a
forward reaches the parameters: the wrapper's own forward for the plain path, and a ``run(fn)`` that runs the lean
computation *as* the wrapper's forward. Built for DDP and FSDP2 in :mod:`drmas_train.distributed.data_parallel`;
a plain model needs none (:meth:`Forward.of`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from drmas_train.model.lm_head import chunked_token_logprobs

__all__ = ["Forward", "forward_logprobs", "pack_prompt_response", "cache_kwarg", "split_lm_head", "can_share_prompts",
           "worth_sharing_prompts", "shared_prompt_hidden"]


def _direct(fn: Callable[[], Any]) -> Any:
    return fn()


@dataclass(frozen=True)
class Forward:
    """How a forward pass reaches a model's parameters (see the module docstring).

    Attributes:
        module: the model whose decoder and LM head the lean path calls directly (the Hugging Face module).
        call: the model's own forward, ``call(**inputs) -> output`` (a wrapper's, with its hooks).
        run: ``run(fn) -> fn()``, run as the model's forward so that a wrapper's hooks see the parameters ``fn``
            uses directly.
    """

    module: Any
    call: Callable[..., Any]
    run: Callable[[Callable[[], Any]], Any] = _direct

    @classmethod
    def of(cls, model: Any) -> Forward:
        """A plain model (or one that already is a :class:`Forward`): its own forward, nothing around it."""
        return model if isinstance(model, Forward) else cls(model, model)


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


#: config attributes that make a model's logits differ from ``lm_head(last hidden state)``; a model setting any
#: of them to a non-neutral value takes the plain (full logits) path.
_LOGIT_TRANSFORMS = {"final_logit_softcapping": None, "logit_scale": 1.0, "logits_scaling": 1.0}


def split_lm_head(model: Any) -> tuple[Any, torch.nn.Linear] | None:
    """``(decoder, lm_head)`` of a causal LM whose logits are exactly ``lm_head(decoder(...).last_hidden_state)``.

    Returns None when that cannot be relied on: no ``get_decoder``/``get_output_embeddings``, a head that is not
    a plain ``nn.Linear`` (e.g. wrapped by a LoRA adapter), or a config with logit soft-capping or scaling.
    PEFT models are unwrapped (LoRA layers inside the decoder stay active).
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        decoder, head = base.get_decoder(), base.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    if decoder is None or decoder is base or type(head) is not torch.nn.Linear:
        return None
    config = getattr(base, "config", None)
    for name, neutral in _LOGIT_TRANSFORMS.items():
        if getattr(config, name, neutral) not in (neutral, None):
            return None
    return decoder, head


def forward_logprobs(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    lm_head_chunk: int | None = 0,
    share_prompts: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of ``response_ids`` given ``prompt_ids`` under ``model``, one forward for the batch.

    Gradients flow (call under ``torch.no_grad()`` for reference/old log-probs). Logits are computed for the
    response positions only, never the prompt's. Under ``torch.autocast`` the model runs in the autocast dtype;
    log-softmax is always taken in float32.

    Args:
        model: a causal LM (transformers ``PreTrainedModel`` or PEFT wrapper) on its device, or a :class:`Forward`
            over a wrapped one (see the module docstring).
        prompt_ids: B prompts (token ids, chat template applied, each non-empty).
        response_ids: B responses (token ids, possibly empty).
        pad_token_id: id used for padding (masked out; any valid id works).
        temperature: the sampling temperature (0 = greedy, taken as 1).
        with_entropy: also return the entropy of the temperature-scaled distribution per position.
        entropy_grad: the entropy carries gradients (needed only when the loss has an entropy term); False
            computes it without autograd (the plain path) or never backpropagates it (the chunked path).
        lm_head_chunk: tokens per LM-head chunk (see the module docstring); None = automatic from the vocabulary
            size (:func:`drmas_train.model.lm_head.default_chunk`); 0 = the plain full-logits path (the default, which
            keeps the old numerics for callers that do not opt in).
        share_prompts: compute each distinct prompt once (needs the chunked path and a model whose cache layers
            are plain ``DynamicLayer``; otherwise ignored). Pays off when prompts repeat within the batch.

    Returns:
        ``(logprobs, response_mask, entropy)``: logprobs (B, T) float32, 0 on padding; response_mask (B, T)
        float32; entropy (B, T) float32 in nats (0 on padding) or None. T = longest response.

    Raises:
        ValueError: see :func:`pack_prompt_response`; a negative temperature or ``lm_head_chunk``.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy, scored at 1), got {temperature}")
    if lm_head_chunk is not None and lm_head_chunk < 0:
        raise ValueError(f"lm_head_chunk must be >= 0 tokens (0 = plain path, None = automatic), got {lm_head_chunk}")
    scale = float(temperature) if temperature > 0 else 1.0
    fwd = Forward.of(model)
    inner = fwd.module
    device = next(inner.parameters()).device
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"got {len(prompt_ids)} prompts but {len(response_ids)} responses; they must pair up")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt must have at least one token (apply the chat template first)")
    batch, resp_len = len(response_ids), max((len(r) for r in response_ids), default=0)
    if resp_len == 0:
        empty = torch.zeros((batch, 0), dtype=torch.float32, device=device)
        return empty, empty.clone(), (empty.clone() if with_entropy else None)
    split = split_lm_head(inner) if lm_head_chunk != 0 else None
    if split is None:
        return _plain_logprobs(fwd.call, device, prompt_ids, response_ids, pad_token_id, scale, with_entropy, entropy_grad)
    decoder, head = split

    def lean() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        if share_prompts and worth_sharing_prompts(inner, prompt_ids):
            hidden, response_mask = shared_prompt_hidden(inner, decoder, prompt_ids, response_ids, pad_token_id, device)
        else:
            hidden, response_mask = _packed_hidden(decoder, prompt_ids, response_ids, pad_token_id, device)
        real = response_mask.bool()  # (B, T)
        targets = torch.zeros((batch, resp_len), dtype=torch.long)
        for b, r in enumerate(response_ids):
            targets[b, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
        logp, ent = chunked_token_logprobs(
            hidden[real], head.weight, targets.to(device)[real], bias=head.bias, temperature=scale,
            chunk=lm_head_chunk, with_entropy=with_entropy,
        )  # fmt: skip
        if ent is not None and not entropy_grad:
            ent = ent.detach()
        zeros = torch.zeros((batch, resp_len), dtype=logp.dtype, device=device)  # float32 (float64 for a float64 model)
        logprobs = zeros.masked_scatter(real, logp)
        entropy = zeros.masked_scatter(real, ent) if ent is not None else None
        return logprobs, response_mask, entropy

    return fwd.run(lean)  # the decoder and head are called directly: inside a wrapper's forward, if any


def _plain_logprobs(model, device, prompt_ids, response_ids, pad_token_id, scale, with_entropy, entropy_grad):
    """The reference path: full (B, T, V) logits from ``model(...)`` (``logits_to_keep`` = T + 1)."""
    input_ids, attention_mask, position_ids, response_mask = pack_prompt_response(
        prompt_ids, response_ids, pad_token_id, device
    )
    resp_len = response_mask.shape[1]
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
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            logp_all = torch.log_softmax(logits, dim=-1)  # (B, T, V)
            entropy = -(logp_all.exp() * logp_all).sum(-1) * response_mask  # (B, T)
    return logprobs, response_mask, entropy


def _packed_hidden(decoder, prompt_ids, response_ids, pad_token_id, device):
    """(B, T, H) last hidden states at the positions predicting each response token, and the (B, T) mask.

    The input is ``prompt + response[:-1]`` (the last response token predicts nothing we score).
    """
    resp_len = max(len(r) for r in response_ids)
    input_ids, attention_mask, position_ids, _ = pack_prompt_response(
        prompt_ids, [list(r)[:-1] for r in response_ids], pad_token_id, device
    )
    prompt_len = max(len(p) for p in prompt_ids)
    hidden = decoder(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state  # (B, P + T - 1, H)
    return hidden[:, prompt_len - 1 : prompt_len - 1 + resp_len], _response_mask(response_ids, resp_len, device)


def _response_mask(response_ids, resp_len, device):
    lengths = torch.as_tensor([len(r) for r in response_ids], device=device).unsqueeze(-1)
    return (torch.arange(resp_len, device=device) < lengths).to(torch.float32)  # (B, T)


def can_share_prompts(model: Any, lm_head_chunk: int | None = None) -> bool:
    """Whether ``forward_logprobs(model, ..., lm_head_chunk=lm_head_chunk, share_prompts=True)`` can share prompts:
    the chunked path applies (:func:`split_lm_head`, ``lm_head_chunk != 0``) and the model's cache layers are plain
    ``DynamicLayer`` s (:func:`drmas_train.model.prefill.can_stitch`)."""
    from drmas_train.model.prefill import can_stitch

    model = Forward.of(model).module
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return lm_head_chunk != 0 and split_lm_head(model) is not None and can_stitch(base)


def worth_sharing_prompts(model: Any, prompt_ids: Sequence[Sequence[int]]) -> bool:
    """Some prompt repeats, every prompt has a token besides its last, and the cache can be shared by rows (plain
    ``DynamicLayer`` s, and no activation checkpointing, under which transformers' layers drop the cache)."""
    from drmas_train.model.prefill import can_stitch

    distinct = {tuple(p) for p in prompt_ids}
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if base.training and torch.is_grad_enabled() and any(getattr(m, "gradient_checkpointing", False) for m in base.modules()):
        return False
    return len(distinct) < len(prompt_ids) and all(len(p) >= 2 for p in prompt_ids) and can_stitch(base)


def shared_prompt_hidden(
    model: Any,
    decoder: Any,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    pad_token_id: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Like :func:`_packed_hidden`, each distinct prompt computed once (see the module docstring); the policy's
    log-probabilities and the critic's values (:func:`drmas_train.model.value_model.forward_values`) both use it.

    1. the distinct prompts without their last token, left-padded (U, P'), one forward with a fresh cache;
    2. the cache rows repeated for the B rows (indexing: autograd sums the rows' gradients back);
    3. ``[last prompt token] + response[:-1]`` of each row, right-padded (B, T), on top of it: position t
       predicts response token t.

    Args:
        model: the module whose ``config`` builds the cache. decoder: its decoder (embeddings, layers, final norm).
        prompt_ids: B prompts of >= 2 tokens. response_ids: B responses (T = the longest, >= 1).

    Returns:
        ``(hidden, mask)``: (B, T, H) last hidden states at the positions predicting each response token, in the
        decoder's dtype, and the (B, T) float32 response mask.
    """
    from transformers import DynamicCache

    distinct: dict[tuple[int, ...], int] = {}
    row_to_unique = [distinct.setdefault(tuple(p), len(distinct)) for p in prompt_ids]
    prefixes = [list(u)[:-1] for u in distinct]
    ids, mask, positions, _ = pack_prompt_response(prefixes, [[] for _ in prefixes], pad_token_id, device)
    kw = cache_kwarg(decoder)
    cache = DynamicCache(config=getattr(model, "config", None))
    decoder(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **{kw: cache})
    rows = torch.as_tensor(row_to_unique, dtype=torch.long, device=device)
    cache.batch_select_indices(rows)  # (U, ...) -> (B, ...), differentiable
    resp_len = max(len(r) for r in response_ids)
    suffix = torch.full((len(prompt_ids), resp_len), pad_token_id, dtype=torch.long)
    for b, (p, r) in enumerate(zip(prompt_ids, response_ids, strict=True)):
        suffix[b, : max(len(r), 1)] = torch.as_tensor([p[-1], *list(r)[:-1]], dtype=torch.long)
    suffix_mask = _response_mask(response_ids, resp_len, device)
    suffix_mask[:, 0] = 1.0  # the last prompt token, even for an empty response
    start = mask.sum(-1)[rows].unsqueeze(-1)  # (B, 1) real prefix tokens of each row
    hidden = decoder(
        input_ids=suffix.to(device),
        attention_mask=torch.cat([mask[rows], suffix_mask.long()], dim=-1),
        position_ids=start + torch.arange(resp_len, device=device),
        use_cache=True,
        **{kw: cache},
    ).last_hidden_state  # (B, T, H)
    return hidden, _response_mask(response_ids, resp_len, device)
