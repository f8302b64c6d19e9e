"""Token log-probabilities through the LM head in chunks, without a full-vocabulary autograd graph.

Shape legend: **N** response tokens (flattened over the batch, real tokens only), **H** hidden size, **V** vocabulary.

A plain ``log_softmax(lm_head(h))`` keeps several (N, V) float32 tensors alive from the forward to the backward
(logits, their log-softmax, the softmax for the entropy): for SmolLM2 (V = 49152) 2-3 GB on one update. Here the
forward runs the head over chunks of ``chunk`` tokens under no autograd and keeps only, per token, the log-sum-exp
and the entropy; the backward recomputes each chunk's logits (one more head matmul) and applies the closed-form
gradients of the log-softmax and of the entropy. At most a few (chunk, V) tensors exist at any time. This is the
technique of Liger-Kernel's fused linear cross-entropy and of Apple's "Cut Your Losses" (Wijmans et al. 2024,
arXiv 2411.09009), with the per-token upstream gradient a PPO loss needs instead of a fused scalar loss.

Gradients (z = logits / temperature, p = softmax(z), lp = log p, H = -sum_j p_j lp_j):

* d lp[target] / d z_j = 1[j = target] - p_j
* d H / d z_j = -p_j (lp_j + H)
"""

from __future__ import annotations

import torch

__all__ = ["chunked_token_logprobs", "default_chunk"]


def default_chunk(vocab_size: int, elements: int = 1 << 23) -> int:
    """Tokens per chunk so that one (chunk, V) float32 tensor holds about ``elements`` values (32 MiB by default:
    170 tokens for a 49k vocabulary, still a large enough matmul; the backward holds about four such tensors)."""
    return max(16, elements // max(int(vocab_size), 1))


def _logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, scale: float) -> torch.Tensor:
    """(c, V) float32 logits of hidden rows ``h`` (c, H), divided by the temperature ``scale``."""
    z = h @ weight.T
    if bias is not None:
        z = z + bias
    z = z.to(torch.promote_types(z.dtype, torch.float32))  # float32, or float64 for a float64 model (tests)
    return z / scale if scale != 1.0 else z


class _ChunkedLogprob(torch.autograd.Function):
    """Autograd function behind :func:`chunked_token_logprobs` (see the module docstring)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, scale, chunk, with_entropy):  # noqa: D102
        n = hidden.shape[0]
        device = hidden.device.type
        # under autocast the head runs in the autocast dtype (as nn.Linear would); explicit casts, autocast off
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        w = weight.to(dtype)
        b = bias.to(dtype) if bias is not None else None
        out = torch.promote_types(dtype, torch.float32)
        logp = hidden.new_empty(n, dtype=out)
        lse = hidden.new_empty(n, dtype=out)
        ent = hidden.new_empty(n if with_entropy else 0, dtype=out)
        with torch.no_grad(), torch.autocast(device, enabled=False):
            for s in range(0, n, chunk):
                z = _logits(hidden[s : s + chunk].to(dtype), w, b, scale)  # (c, V)
                lse_c = torch.logsumexp(z, dim=-1)  # (c,)
                lse[s : s + chunk] = lse_c
                logp[s : s + chunk] = z.gather(-1, targets[s : s + chunk, None]).squeeze(-1) - lse_c
                if with_entropy:  # H = -sum_j p_j lp_j
                    lp = z - lse_c[:, None]
                    ent[s : s + chunk] = -(lp.exp() * lp).sum(-1)
        ctx.save_for_backward(hidden, weight, bias, targets, lse, ent)
        ctx.scale, ctx.chunk, ctx.dtype = scale, chunk, dtype
        ctx.set_materialize_grads(False)
        if not with_entropy:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):  # noqa: D102
        hidden, weight, bias, targets, lse, ent = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        if g_ent is not None and ent.numel() == 0:
            g_ent = None
        if g_logp is None and g_ent is None:
            return None, None, None, None, None, None, None
        scale, chunk, dtype = ctx.scale, ctx.chunk, ctx.dtype
        w = weight.to(dtype)
        b = bias.to(dtype) if bias is not None else None
        grad_h = torch.empty_like(hidden) if need_h else None
        acc = torch.promote_types(dtype, torch.float32)  # gradient accumulators: float32 at least
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=acc, device=weight.device) if need_b else None
        with torch.no_grad(), torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, hidden.shape[0], chunk):
                h = hidden[s : s + chunk].to(dtype)
                lp = _logits(h, w, b, scale) - lse[s : s + chunk, None]  # (c, V) log-softmax
                p = lp.exp()
                if g_logp is not None:
                    g = g_logp[s : s + chunk, None].to(p.dtype)  # (c, 1)
                    dz = p * -g
                    dz.scatter_add_(-1, targets[s : s + chunk, None], g)
                else:
                    dz = torch.zeros_like(p)
                if g_ent is not None:
                    dz -= p * (lp + ent[s : s + chunk, None]) * g_ent[s : s + chunk, None].to(p.dtype)
                if scale != 1.0:
                    dz /= scale
                dz = dz.to(dtype)  # (c, V)
                if need_h:
                    grad_h[s : s + chunk] = (dz @ w).to(hidden.dtype)
                if need_w:  # (V, H) accumulated in float32, in place when the head computes in float32
                    if dz.dtype == acc:
                        grad_w.addmm_(dz.T, h)
                    else:
                        grad_w += (dz.T @ h).to(acc)
                if need_b:
                    grad_b += dz.to(acc).sum(0)
        if grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
        if grad_b is not None:
            grad_b = grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


def chunked_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk: int | None = None,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(hidden @ weight.T + bias) / temperature)[targets]`` per token, and the entropy, chunk by chunk.

    Equal to the plain full-vocabulary computation up to float rounding, values and gradients (``hidden``,
    ``weight`` and ``bias``; tests/drmas_train/model/test_lm_head.py). Gradients flow into the log-probs always and into the
    entropy only when the caller's loss uses it (no cost otherwise).

    Args:
        hidden: (N, H) final hidden states (after the model's last norm) at the positions that predict ``targets``.
        weight: (V, H) LM-head weight (tied or not). bias: (V,) or None.
        targets: (N,) long token ids to score.
        temperature: logits are divided by it (> 0).
        chunk: tokens per chunk; None = :func:`default_chunk` of V.
        with_entropy: also return the (N,) entropy in nats of each temperature-scaled distribution.

    Returns:
        ``(logprobs, entropy)``: (N,) float32 each (float64 for a float64 head); entropy None unless
        ``with_entropy``.

    Raises:
        ValueError: shapes that do not line up, a temperature <= 0 or a chunk < 1.
    """
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1] or weight.dim() != 2 or weight.shape[1] != hidden.shape[1]:
        raise ValueError(
            f"need hidden (N, H), weight (V, H), targets (N,); got {tuple(hidden.shape)}, {tuple(weight.shape)}, "
            f"{tuple(targets.shape)}"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    chunk = default_chunk(weight.shape[0]) if chunk is None else int(chunk)
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1 token, got {chunk}")
    logp, ent = _ChunkedLogprob.apply(hidden, weight, bias, targets, float(temperature), chunk, bool(with_entropy))
    return logp, (ent if with_entropy else None)
