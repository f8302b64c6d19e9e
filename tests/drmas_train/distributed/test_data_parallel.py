"""(a) A 2-rank update of one model equals the single-process update on the same samples.

Tolerance: the ranks sum their micro-batch gradients in another order than one process does (the all-reduce /
reduce-scatter adds the ranks' partial sums), so gradients agree to float32 rounding (~1e-7 relative), not
bit for bit: losses and grad norms are compared at rel 1e-5. Weights after two AdamW steps at lr 1e-2: AdamW's
per-element step lr * m / (sqrt(v) + 1e-8) turns a rounding-level difference into up to ~1e-3 * lr where a
gradient element is itself near 1e-8 (seen: 1 element in 2,048 off by 5.5e-6), so every element must agree to
atol 1e-3 * lr = 1e-5 and 99.9 % of them to 1e-6.

Both sides run the lean forward (``ppo_update``'s defaults: the chunked LM head; on the ranks inside the DDP /
FSDP2 forward, ``drmas_train.distributed.data_parallel.call_as_forward``). Grouped prompts (shared under DDP) and the π_old
recompute on ranks are checked on spawned gloo ranks in tests/drmas_train/distributed/test_lean_ranks.py.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from drmas_train.algorithm.optim import build_optimizer, micro_batches
from drmas_train.algorithm.settings import UpdateSettings
from drmas_train.algorithm.update import ppo_update
from drmas_train.model.models import ModelSpec
from helpers.tiny_rl import tiny_loader, tiny_samples

pytestmark = pytest.mark.slow  # Ray actors start in ~10-30 s on 2 cores (still run in CI)

OPTIM = {"lr": 1e-2, "weight_decay": 0.0}
#: 2 mini-batches of 10-token micro-batches; π_old as the samples carry it (the ranks recompute it in test_lean_ranks.py);
#: drmas's loss layout (one token mean per shuffled mini-batch), whose objective does not depend on the rank count
SETTINGS = UpdateSettings.defaults(mini_batches=2, micro_batch_tokens=10, recompute_old_logprobs=False,
                                   loss_micro_batch_size=None, mini_batch_order="shuffle")  # fmt: skip
ADV = np.array([1.0, -0.5, 0.3, -1.2, 0.8, 0.0, 0.4, -0.9])


@pytest.mark.parametrize("strategy", ["fsdp2", "ddp"])
def test_two_rank_update_equals_single_process(ray_cluster, strategy):
    from drmas_train.distributed.resource_pool import ResourcePool
    from drmas_train.distributed.worker_group import WorkerGroup

    spec = ModelSpec("tiny")
    base = tiny_loader(spec, "m").model
    samples = tiny_samples(base)
    single = copy.deepcopy(base)
    expected = ppo_update(single, build_optimizer("m", single, **OPTIM), samples, ADV, SETTINGS, pad_token_id=0, seed=7)
    assert expected["steps"] == 2.0  # two mini-batches, each cut into several micro-batches (budget 10 tokens)
    # the same plan as dp_ppo_update: with an odd micro-batch count rank 1 runs an idle (zero-loss) pass
    plan = []
    for mb in np.array_split(np.random.default_rng(7).permutation(len(samples)), 2):
        mb = mb[ADV[mb] != 0]
        plan.append(len(micro_batches([len(samples[i].prompt_ids) + len(samples[i].response_ids) for i in mb], SETTINGS.micro_batch_tokens)))
    assert min(plan) >= 2 and any(n % 2 for n in plan), plan

    pool = ResourcePool(2)
    group = WorkerGroup("m", spec, pool, [0, 1], loader=tiny_loader, optim_kwargs=OPTIM, strategy=strategy)
    try:
        assert group.strategy == strategy and group.version == 0
        got = group.update(samples, ADV, 7, SETTINGS)
        weights = group.full_state_dict()
        assert group.version == 1  # the update pushed new weights to the generation workers
    finally:
        group.close()
        pool.shutdown()
    assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)
    assert got["pg_loss"] == pytest.approx(expected["pg_loss"], rel=1e-5)
    assert got["steps"] == expected["steps"] and got["ratio_mean"] == pytest.approx(expected["ratio_mean"], rel=1e-5)
    assert got["ratio_mean"] != 1.0  # the 2nd mini-batch ran on updated weights on both paths
    want = single.state_dict()
    assert sorted(weights) == sorted(want)
    moved = max(float((want[k] - base.state_dict()[k]).abs().max()) for k in want)
    assert moved > 1e-3  # the update really changed the weights
    diff = torch.cat([(weights[k] - v).abs().flatten() for k, v in want.items()])
    assert float(diff.max()) <= 1e-3 * OPTIM["lr"]
    assert float((diff <= 1e-6).float().mean()) >= 0.999
