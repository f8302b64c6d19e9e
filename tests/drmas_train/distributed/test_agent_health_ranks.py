"""The per-agent gradient split on data-parallel ranks equals the single process's (FSDP2 and DDP, 2 gloo ranks).

Each rank holds a part of each agent's gradient until the gradients are synchronised at the end of the agent's part
of a mini-batch; FSDP2 ranks then hold shards of it, whose squared norms and inner products are summed over the ranks
(``UpdateHooks.sum_shards``); DDP ranks hold it whole. Both give every rank the single process's numbers, up to float
summation order (rel 1e-5, as tests/drmas_train/distributed/test_lean_ranks.py).
"""

from __future__ import annotations

import copy

import pytest
import torch

from drmas_train.algorithm.optim import build_optimizer
from drmas_train.algorithm.update import ppo_update
from helpers.health_workers import OPTIM, run, samples_and_advantages, settings
from helpers.spawn_ranks import spawn_ranks

WORLD = 2
pytestmark = pytest.mark.slow  # two spawned ranks import torch and transformers: ~60 s on 2 loaded cores


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("health")
    spawn_ranks(run, WORLD, tmp)
    return torch.load(tmp / "health.pt", weights_only=False)


@pytest.fixture(scope="module")
def single():
    from drmas_train.model.models import ModelSpec
    from helpers.tiny_rl import tiny_loader

    base = tiny_loader(ModelSpec("tiny"), "m").model
    samples, adv = samples_and_advantages(base)
    model = copy.deepcopy(base)
    return ppo_update(
        model, build_optimizer("m", model, **OPTIM), samples, adv, settings(), pad_token_id=0, seed=7
    )


@pytest.mark.parametrize("strategy", ["fsdp2", "ddp"])
def test_rank_agent_gradients_equal_the_single_process(ranks, single, strategy):
    per_rank = ranks[strategy]
    keys = [k for k in single if k.startswith("agent/")]
    assert {k.split("/")[1] for k in keys} == {"solver", "verifier"}
    assert len(keys) == 10
    for metrics in per_rank:  # every rank reports the same, reduced numbers
        assert metrics["steps"] == single["steps"] == 2.0
        for key in keys + ["grad_norm"]:
            assert metrics[key] == pytest.approx(single[key], rel=1e-5), (strategy, key)
        assert metrics["agent/solver/grad_share"] + metrics["agent/verifier/grad_share"] == pytest.approx(
            1.0, abs=1e-9
        )
