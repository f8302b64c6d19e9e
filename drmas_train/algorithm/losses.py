"""PPO policy loss for LLM responses: clipped surrogate (asymmetric + dual clip), aggregation, KL, entropy.

Shape legend: **B** samples (agent calls), **T** response tokens (right-padded; ``mask`` marks real tokens).

The surrogate follows PPO (Schulman et al. 2017, arXiv 1707.06347, Eq. (7)) with the asymmetric clip range of
DAPO (arXiv 2503.14476, "clip-higher") and the dual clip of Ye et al. 2020 (arXiv 1912.09729, Eq. (5)), as
implemented in verl's ``compute_policy_loss`` (the Dr. MAS reference code base). Per token::

    r     = exp(logp - old_logp)
    L_clip = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))
    L     = min(L_clip, -A c)   if A < 0      (dual clip, c = dual_clip_c > 1)
          = L_clip              otherwise
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

__all__ = ["AGG_MODES", "KL_ESTIMATORS", "PolicyLossConfig", "LOSS_FIELDS", "aggregate", "kl_penalty", "policy_loss",
           "value_loss"]

#: accepted ``agg`` values of :func:`aggregate` (verl's ``loss_agg_mode``).
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
#: accepted KL estimators (Schulman, "Approximating KL divergence", 2020): k1 = log ratio, k2 = half its square,
#: k3 = low variance; the reference's names ``kl`` / ``mse`` / ``low_var_kl`` (``verl/trainer/ppo/core_algos.py:954-967``).
KL_ESTIMATORS = ("k1", "k2", "k3")


@dataclass(frozen=True)
class PolicyLossConfig:
    """Settings of :func:`policy_loss`: the loss fields of the ``algorithm`` config section, under the same names
    (their defaults live there, :class:`drmas_train.algorithm.config.AlgorithmConfig`; build one with
    :func:`drmas_train.algorithm.settings.loss_settings`).

    Attributes:
        clip_low: lower clip epsilon, ratio floor ``1 - clip_low`` (PPO 0.2).
        clip_high: upper clip epsilon, ratio ceiling ``1 + clip_high`` (DAPO clip-higher uses 0.28).
        dual_clip_c: dual-clip constant c > 1 bounding the loss of negative advantages at ``-A c``; ``None`` = off.
        loss_agg: one of :data:`AGG_MODES`.
        kl_coef: weight of the KL(pi || pi_ref) penalty (0 = off, the reference default).
        kl_estimator: one of :data:`KL_ESTIMATORS`.
        entropy_coef: weight of the entropy bonus (subtracted from the loss; 0 = off).

    Raises:
        ValueError: a value out of range; the message starts with the field's name (the config section prefixes
            ``algorithm.``): these are the loss settings' only checks.
    """

    clip_low: float
    clip_high: float
    dual_clip_c: float | None
    loss_agg: str
    kl_coef: float
    kl_estimator: str
    entropy_coef: float

    def __post_init__(self) -> None:
        if self.loss_agg not in AGG_MODES:
            raise ValueError(f"loss_agg={self.loss_agg!r}; accepted: {list(AGG_MODES)}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator={self.kl_estimator!r}; accepted: {list(KL_ESTIMATORS)}")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError(f"clip_low must be in [0, 1) and clip_high >= 0, got {self.clip_low}, {self.clip_high}")
        if self.dual_clip_c is not None and not self.dual_clip_c > 1:
            raise ValueError(f"dual_clip_c must be > 1 or null (off), got {self.dual_clip_c}")


#: the names of :class:`PolicyLossConfig`'s fields (the same names as in the ``algorithm`` config section).
LOSS_FIELDS = tuple(f.name for f in fields(PolicyLossConfig))


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, agg: str, *, denom: float | torch.Tensor | None = None
) -> torch.Tensor:
    """Reduce per-token ``values`` (B, T) over real tokens ``mask`` (B, T) to a scalar.

    * ``token-mean``: ``sum(v m) / sum(m)`` — every token weighs the same (default, DAPO).
    * ``seq-mean-token-mean``: mean over sequences of each sequence's token mean (original GRPO).
    * ``seq-mean-token-sum``: mean over sequences of each sequence's token sum (Dr. GRPO, arXiv 2503.20783).

    As ``agg_loss`` (``langfengQ/DrMAS verl/trainer/ppo/core_algos.py:790-812``).

    Args:
        denom: the divisor to use instead of this batch's token count (``token-mean``) or sequence count
            (``seq-*``): a float for all rows, or a (B,) tensor with each row's own divisor. The update passes the
            divisors of its loss layout (:mod:`drmas_train.algorithm.batch_layout`), so that gradient accumulation
            over its micro-batches sums to exactly the layout's loss.

    Raises:
        ValueError: unknown ``agg`` or shape mismatch.
    """
    if values.shape != mask.shape:
        raise ValueError(f"values {tuple(values.shape)} and mask {tuple(mask.shape)} differ in shape")
    m = mask.to(values.dtype)
    if agg == "token-mean":
        if not isinstance(denom, torch.Tensor):
            return (values * m).sum() / (denom if denom is not None else m.sum().clamp_min(1.0))
        per_seq = (values * m).sum(-1)  # (B,)
    elif agg == "seq-mean-token-mean":
        per_seq = (values * m).sum(-1) / m.sum(-1).clamp_min(1.0)  # (B,)
    elif agg == "seq-mean-token-sum":
        per_seq = (values * m).sum(-1)  # (B,)
    else:
        raise ValueError(f"unknown loss aggregation {agg!r}; accepted: {list(AGG_MODES)}")
    if isinstance(denom, torch.Tensor):
        return (per_seq / denom.to(device=per_seq.device, dtype=per_seq.dtype)).sum()
    return per_seq.sum() / (denom if denom is not None else max(per_seq.shape[0], 1))


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi, (B, T) -> (B, T).

    Schulman's estimators ("Approximating KL divergence", 2020), as the reference's ``kl_penalty``
    (``verl/trainer/ppo/core_algos.py:942-970``): k1 = ``logp - ref_logp`` (unbiased, high variance; ``kl``);
    k2 = ``(logp - ref_logp)^2 / 2`` (biased, low variance, always >= 0; ``mse``); k3 =
    ``exp(ref - logp) - (ref - logp) - 1`` (unbiased, always >= 0, ``low_var_kl``; its result is clamped to
    [-10, 10] as there, and the log ratio to [-20, 20] here so that ``exp`` cannot overflow).

    Raises:
        ValueError: unknown estimator.
    """
    if estimator == "k1":
        return logprobs - ref_logprobs
    if estimator == "k2":
        return 0.5 * (logprobs - ref_logprobs).square()
    if estimator == "k3":
        log_ratio = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
        return (log_ratio.exp() - log_ratio - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL estimator {estimator!r}; accepted: {list(KL_ESTIMATORS)}")


def _masked_mean(x: torch.Tensor, m: torch.Tensor) -> float:
    return float((x * m).sum() / m.sum().clamp_min(1.0))


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: PolicyLossConfig,
    *,
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    denom: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The PPO loss of one (micro-)batch, and its diagnostics.

    Args:
        logprobs: (B, T) float32 log pi_theta of the response tokens (carries gradients).
        old_logprobs: (B, T) float32 log pi_old from the rollout (no gradient).
        advantages: (B,) per-sequence or (B, T) per-token advantages.
        mask: (B, T) 1 for real response tokens.
        cfg: clip ranges, aggregation, KL and entropy weights.
        entropy: (B, T) token entropies (needed when ``cfg.entropy_coef`` != 0; logged when given).
        ref_logprobs: (B, T) log pi_ref of a frozen reference (needed when ``cfg.kl_coef`` != 0).
        denom: see :func:`aggregate` (a float, or one divisor per row).

    Returns:
        ``(loss, metrics)``: scalar loss = pg_loss + kl_coef * kl - entropy_coef * entropy; metrics ``pg_loss``,
        ``clipfrac_upper`` (share of tokens whose ratio was clipped at 1 + clip_high, A > 0),
        ``clipfrac_lower`` (clipped at 1 - clip_low, A < 0), ``dual_clipfrac`` (A < 0 and the dual clip bound
        applied), ``approx_kl`` (k3 of pi_old vs pi_theta, a drift measure), ``ratio_mean``, and ``entropy`` /
        ``kl`` when available. ``pg_loss`` is the aggregated loss (with ``denom``); the others are token means
        over this batch.

    Raises:
        ValueError: shape mismatch, or a KL/entropy weight set without the tensor it needs.
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and mask "
            f"{tuple(mask.shape)} must have the same (B, T) shape"
        )
    adv = advantages.to(logprobs.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1).expand_as(logprobs)  # (B,) -> (B, T)
    if adv.shape != logprobs.shape:
        raise ValueError(f"advantages must be (B,) or (B, T) = {tuple(logprobs.shape)}, got {tuple(advantages.shape)}")
    m = mask.to(logprobs.dtype)

    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)  # (B, T)
    ratio = log_ratio.exp()  # (B, T)
    loss1 = -adv * ratio  # (B, T) unclipped
    loss2 = -adv * ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)  # (B, T) clipped
    clipped = torch.maximum(loss1, loss2)  # PPO Eq. (7), as a loss
    if cfg.dual_clip_c is not None:
        loss3 = -adv * cfg.dual_clip_c  # (B, T)
        per_token = torch.where(adv < 0, torch.minimum(clipped, loss3), clipped)  # dual clip, arXiv 1912.09729
        dual = ((adv < 0) & (clipped > loss3)).to(m.dtype)
    else:
        per_token, dual = clipped, torch.zeros_like(m)
    pg_loss = aggregate(per_token, m, cfg.loss_agg, denom=denom)
    loss = pg_loss

    with torch.no_grad():
        metrics = {
            "pg_loss": pg_loss.item(),
            "clipfrac_upper": _masked_mean(((ratio > 1.0 + cfg.clip_high) & (adv > 0)).to(m.dtype), m),
            "clipfrac_lower": _masked_mean(((ratio < 1.0 - cfg.clip_low) & (adv < 0)).to(m.dtype), m),
            "dual_clipfrac": _masked_mean(dual, m),
            "approx_kl": _masked_mean(kl_penalty(old_logprobs, logprobs.detach(), "k3"), m),
            "ratio_mean": _masked_mean(ratio, m),
        }
    if cfg.kl_coef:
        if ref_logprobs is None:
            raise ValueError("kl_coef != 0 needs ref_logprobs (log-probs of the frozen reference model)")
        kl = aggregate(kl_penalty(logprobs, ref_logprobs, cfg.kl_estimator), m, cfg.loss_agg, denom=denom)
        loss = loss + cfg.kl_coef * kl
        metrics["kl"] = _masked_mean(kl_penalty(logprobs.detach(), ref_logprobs, cfg.kl_estimator), m)
    if entropy is not None:
        metrics["entropy"] = _masked_mean(entropy.detach(), m)
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * aggregate(entropy, m, cfg.loss_agg, denom=denom)
    elif cfg.entropy_coef:
        raise ValueError("entropy_coef != 0 needs the token entropies (forward_logprobs(..., with_entropy=True))")
    return loss, metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None,
    agg: str,
    denom: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped value loss of PPO's critic, and its diagnostics.

    Per token (PPO, Schulman et al. 2017, arXiv 1707.06347; the reference's ``compute_value_loss``,
    ``verl/trainer/ppo/core_algos.py:907-939``, which is TRL's)::

        v_clip = old_v + clamp(v - old_v, -clip, clip)
        L      = max((v - R)^2, (v_clip - R)^2)

    aggregated by :func:`aggregate`. The reference's critic loss has no ``1/2`` factor and neither has this one.

    Args:
        values: (B, T) float32 predictions of the critic being trained (carry gradients).
        old_values: (B, T) the critic's predictions when the returns were computed (no gradient).
        returns: (B, T) GAE returns (advantage + old value; :func:`drmas_train.algorithm.gae.gae`).
        mask: (B, T) 1 for real response tokens.
        clip: the value clip range (``critic.value_clip``, the reference's ``cliprange_value``); None = unclipped.
        agg: one of :data:`AGG_MODES`. denom: see :func:`aggregate`.

    Returns:
        ``(loss, metrics)``: ``vf_loss`` (the aggregated loss), ``vf_clipfrac`` (share of tokens where the clipped
        term was the larger, the reference's ``vf_clipfrac``), ``vpred_mean`` (token mean of ``values``), token means
        over this batch.

    Raises:
        ValueError: shapes differ.
    """
    if not values.shape == old_values.shape == returns.shape == mask.shape:
        raise ValueError(
            f"values {tuple(values.shape)}, old_values {tuple(old_values.shape)}, returns {tuple(returns.shape)} "
            f"and mask {tuple(mask.shape)} must have the same (B, T) shape"
        )
    m = mask.to(values.dtype)
    unclipped = (values - returns).square()  # (B, T)
    if clip is None:
        per_token, clipped_more = unclipped, torch.zeros_like(m)
    else:
        v_clip = old_values + (values - old_values).clamp(-clip, clip)  # (B, T)
        clipped = (v_clip - returns).square()
        per_token = torch.maximum(unclipped, clipped)
        clipped_more = (clipped > unclipped).to(m.dtype)
    loss = aggregate(per_token, m, agg, denom=denom)
    with torch.no_grad():
        metrics = {"vf_loss": loss.item(), "vf_clipfrac": _masked_mean(clipped_more, m),
                   "vpred_mean": _masked_mean(values.detach(), m)}  # fmt: skip
    return loss, metrics
