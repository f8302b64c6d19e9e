"""The reference's batch layout (drmas_train/algorithm/batch_layout.py), checked against transcriptions of the
reference's own code on held-back random batches:

* the loss of each mini-batch: a token (or sequence) mean per micro-batch of ``ppo_micro_batch_size_per_gpu``
  samples, divided by the nominal accumulation count, averaged over ranks (``langfengQ/DrMAS
  verl/workers/actor/dp_actor.py:343-428`` with ``agg_loss``, ``verl/trainer/ppo/core_algos.py:790-812``);
* padding by duplication (``agent_system/multi_turn_rollout/utils.py:286-355``, ``adjust_batch(mode="copy")``), whose
  duplicates enter the advantages' group statistics (``verl/trainer/ppo/ray_trainer.py:1235`` pads before
  ``compute_advantage``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from drmas_train.algorithm.advantages import drmas
from drmas_train.algorithm.batch_layout import pad_by_model, pad_indices, padding_multiple, reference_layout
from drmas_train.algorithm.losses import aggregate
from fidelity.reference_estimators import compute_grpo_outcome_advantage, per_row, token_table


# ---------------------------------------------------------------- the reference, transcribed
def ref_agg_loss(loss_mat, loss_mask, loss_agg_mode):  # core_algos.py:790-812
    if loss_agg_mode == "token-mean":
        return (loss_mat * loss_mask).sum() / loss_mask.sum()  # verl_F.masked_mean
    if loss_agg_mode == "seq-mean-token-sum":
        return torch.mean(torch.sum(loss_mat * loss_mask, dim=-1))
    if loss_agg_mode == "seq-mean-token-mean":
        return torch.mean(torch.sum(loss_mat * loss_mask, dim=-1) / torch.sum(loss_mask, dim=-1))
    raise ValueError(loss_agg_mode)


def ref_minibatch_losses(loss_mat, mask, *, world, update_num, micro, agg):
    """Each optimizer step's loss as the reference reaches it: the batch is dispatched to ``world`` ranks in
    contiguous chunks; on a rank ``batch.split(ppo_mini_batch_size)`` (dp_actor.py:343) with ``ppo_mini_batch_size =
    ceil(bs / (update_num * world))`` (utils.py:352), each mini-batch ``split(ppo_micro_batch_size_per_gpu)``
    (:360), each micro-batch's loss ``/ gradient_accumulation`` (:358, :428) summed by ``backward``; FSDP averages
    the ranks' gradients. Returns {mini-batch index: loss}."""
    bs = loss_mat.shape[0]
    mini_bs = -(-bs // (update_num * world))
    accumulation = mini_bs // micro
    share = bs // world
    out: dict[int, torch.Tensor] = {}
    for rank in range(world):
        rows = torch.arange(rank * share, (rank + 1) * share)
        for b, mb in enumerate(rows.split(mini_bs)):
            rank_loss = sum(ref_agg_loss(loss_mat[u], mask[u], agg) / accumulation for u in mb.split(micro))
            out[b] = out.get(b, 0.0) + rank_loss / world  # FSDP: gradients averaged over ranks
    return out


# ---------------------------------------------------------------- the loss
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize(("bs", "world", "update_num", "micro"), [(16, 1, 1, 4), (16, 2, 1, 4), (24, 2, 3, 2),
                                                                   (10, 1, 2, 4), (32, 4, 1, 4)])  # fmt: skip
def test_per_micro_batch_means_equal_the_reference_with_unequal_lengths(agg, bs, world, update_num, micro):
    rng = np.random.default_rng(9301 + bs + world)
    lengths = rng.integers(1, 13, bs)  # unequal response lengths: micro-batches of different token counts
    loss_mat = torch.as_tensor(rng.normal(size=(bs, 12)))
    mask = torch.as_tensor(np.arange(12)[None, :] < lengths[:, None], dtype=torch.float64)
    want = ref_minibatch_losses(loss_mat, mask, world=world, update_num=update_num, micro=micro, agg=agg)
    layout = reference_layout(lengths.tolist(), agg=agg, mini_batches=update_num, micro_batch_size=micro, world_size=world)
    assert layout.n_mini_batches == len(want)
    for b, loss in want.items():
        rows = np.flatnonzero(layout.mini_batch == b)
        got = aggregate(loss_mat[rows], mask[rows], agg, denom=torch.as_tensor(layout.denom[rows]))
        assert float(got) == pytest.approx(float(loss), abs=1e-9, rel=1e-9)
    # and it is not drmas's one mean per mini-batch: tokens of short micro-batches weigh more
    if agg == "token-mean" and world == 1 and update_num == 1:
        assert float(aggregate(loss_mat, mask, agg)) != pytest.approx(float(want[0]), rel=1e-6)


def test_mini_batches_are_cut_in_order_per_rank():
    layout = reference_layout([3] * 12, agg="token-mean", mini_batches=3, micro_batch_size=2, world_size=2)
    assert layout.mini_batch.tolist() == [0, 0, 1, 1, 2, 2] * 2  # each rank's share, cut in order
    with pytest.raises(ValueError, match="cannot be shared by 2 ranks equally; pad the batch"):
        reference_layout([3] * 5, agg="token-mean", mini_batches=1, micro_batch_size=2, world_size=2)


# ---------------------------------------------------------------- padding by duplication
def ref_adjust_batch_indices(bs, size_divisor, rng):  # utils.py:303-339 (mode="copy"), as indices
    remainder = bs % size_divisor
    if remainder == 0:
        return np.arange(bs)
    parts, remaining = [np.arange(bs)], size_divisor - remainder
    while remaining > 0:
        if remaining >= bs:
            parts.append(np.arange(bs))
            remaining -= bs
        else:
            parts.append(rng.choice(bs, remaining, replace=False))
            remaining = 0
    return np.concatenate(parts)


@pytest.mark.parametrize(("bs", "multiple"), [(5, 8), (3, 8), (8, 8), (30, 32), (1, 4), (100, 128)])
def test_padding_duplicates_as_adjust_batch(bs, multiple):
    got = pad_indices(bs, multiple, np.random.default_rng(7))
    want = ref_adjust_batch_indices(bs, multiple, np.random.default_rng(7))
    assert got.tolist() == want.tolist()
    assert len(got) % multiple == 0 and got[:bs].tolist() == list(range(bs))


def test_the_padding_multiple_of_the_paper_scripts():
    assert padding_multiple(4, 4, 8) == 32  # math: 4 GPUs, ppo_micro 4, log-prob micro 8 (run_math.sh:37,68,94)
    assert padding_multiple(4, 4, 32) == 128  # search: log-prob micro 32 (run_search.sh:66)
    assert padding_multiple(1, 4, 8) == 8


def test_duplicates_enter_the_group_statistics_as_in_the_reference():
    """A padded batch's Dr. MAS advantages equal the reference's compute on the same padded batch, and differ from
    the advantages of the unpadded batch (the duplicates move the group means and stds)."""
    rng = np.random.default_rng(9313)
    uid = np.repeat(["q0", "q1", "q2"], 6)
    agent = np.tile(["solver", "solver", "verifier"], 6)
    traj = np.array([f"{u}/{i // 3}" for i, u in enumerate(uid)])
    scores = rng.choice([0.0, 1.0, -0.1, 0.9], size=len(uid))
    lengths = rng.integers(1, 6, len(uid))
    models = np.array(["shared"] * len(uid))
    idx = pad_by_model(models, {"shared": 8}, rng)
    assert len(idx) == 24 and idx[:18].tolist() == list(range(18))
    got = drmas(scores[idx], uid=uid[idx], agent_id=agent[idx])
    rewards, mask = token_table(scores[idx], lengths[idx])
    index = np.array([f"{u}_{a}" for u, a in zip(uid[idx], agent[idx], strict=True)], dtype=object)  # ray_trainer.py:269-274
    want = per_row(compute_grpo_outcome_advantage(rewards, mask, index, traj[idx], group_by_agent_id=True)[0], mask)
    np.testing.assert_allclose(got, want, atol=1e-6)
    unpadded = drmas(scores, uid=uid, agent_id=agent)
    assert not np.allclose(got[:18], unpadded)
