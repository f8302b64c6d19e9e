"""The engine/trainer log-prob drift: how far the rollout engine's log-probs of the sampled tokens are from the
training model's (nats and probabilities), overall and per agent.

Logged wherever π_old is taken from the training model: a separate no-grad forward
(:mod:`drmas_train.algorithm.old_logprobs`) or the update's own first forward when the update is strictly on-policy
(:func:`drmas_train.algorithm.update.reuses_update_forward`). The reference logs the same over probabilities
(``langfengQ/DrMAS verl/trainer/ppo/ray_trainer.py:1290-1298``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from drmas_train.algorithm.agent_grads import AGENT_PREFIX
from drmas_train.collect.samples import Sample

__all__ = ["logprob_mismatch", "agent_logprob_gaps"]


def logprob_mismatch(
    engine: Sequence[Sequence[float]], recomputed: Sequence[Sequence[float]], masks: Sequence[Sequence[int]]
) -> dict[str, float]:
    """Drift between the engine's and the trainer's log-probs of the same tokens, over tokens with mask 1.

    Args:
        engine: B rows of the rollout engine's per-token log-probs (nats; row b has T_b entries).
        recomputed: B rows of the training model's log-probs of the same tokens (same lengths).
        masks: B rows of response masks (1 = token counts in the loss).

    Returns:
        ``old_logprob_abs_diff_max`` / ``old_logprob_abs_diff_mean``: max and mean of ``|Δ log p|`` (nats);
        ``old_prob_abs_diff_max`` / ``_mean`` / ``_std`` (n - 1): the same for ``|Δ p|``, the reference's
        ``rollout_probs_diff_{max,mean,std}`` (langfengQ/DrMAS verl/trainer/ppo/ray_trainer.py:1290-1298);
        ``old_logprob_tokens``: how many tokens were compared. Empty dict when no token has mask 1.

    Raises:
        ValueError: rows of different counts or lengths.
    """
    if not len(engine) == len(recomputed) == len(masks):
        raise ValueError(f"got {len(engine)} engine rows, {len(recomputed)} recomputed rows and {len(masks)} masks")
    diffs_lp, diffs_p = [], []
    for b, (e, r, m) in enumerate(zip(engine, recomputed, masks, strict=True)):
        if not len(e) == len(r) == len(m):
            raise ValueError(f"row {b}: {len(e)} engine log-probs, {len(r)} recomputed, {len(m)} mask entries")
        keep = np.asarray(m, dtype=bool)
        e_np, r_np = np.asarray(e, dtype=np.float64)[keep], np.asarray(r, dtype=np.float64)[keep]
        diffs_lp.append(np.abs(e_np - r_np))
        diffs_p.append(np.abs(np.exp(e_np) - np.exp(r_np)))
    lp = np.concatenate(diffs_lp) if diffs_lp else np.zeros(0)
    if lp.size == 0:
        return {}
    p = np.concatenate(diffs_p)
    return {
        "old_logprob_abs_diff_max": float(lp.max()),
        "old_logprob_abs_diff_mean": float(lp.mean()),
        "old_prob_abs_diff_max": float(p.max()),
        "old_prob_abs_diff_mean": float(p.mean()),
        "old_prob_abs_diff_std": float(p.std(ddof=1)) if p.size > 1 else 0.0,  # torch.std: n - 1, as the reference
        "old_logprob_tokens": float(lp.size),
    }


def agent_logprob_gaps(samples: Sequence[Sample], recomputed: Sequence[Sequence[float]]) -> dict[str, float]:
    """The engine/trainer log-prob gap per agent: ``agent/<a>/logprob_gap_mean`` and ``agent/<a>/logprob_gap_max``,
    the mean and max of ``|log p_engine - log p_trainer|`` (nats) over the agent's tokens with mask 1
    (:func:`logprob_mismatch` of its samples). Agents without such tokens are left out.

    Args:
        samples: (B,) samples with the engine's ``old_logprobs``. recomputed: B rows of the trainer's log-probs.
    """
    out: dict[str, float] = {}
    for agent in sorted({s.agent_id for s in samples}):
        rows = [i for i, s in enumerate(samples) if s.agent_id == agent]
        m = logprob_mismatch([samples[i].old_logprobs for i in rows], [recomputed[i] for i in rows],
                             [samples[i].response_mask for i in rows])  # fmt: skip
        if m:
            out[f"{AGENT_PREFIX}{agent}/logprob_gap_mean"] = m["old_logprob_abs_diff_mean"]
            out[f"{AGENT_PREFIX}{agent}/logprob_gap_max"] = m["old_logprob_abs_diff_max"]
    return out
