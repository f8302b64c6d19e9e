"""Data-parallel ranks take the single process's lean forward (chunked LM head; shared prompts under DDP), run
inside the wrapper's forward so FSDP2's root hooks and DDP's reducer see the parameters it uses.

2 gloo ranks spawned with ``torch.multiprocessing`` (no Ray: the same ``dp_ppo_update`` the Ray ranks run, in a
few seconds). Tolerance as tests/drmas_train/distributed/test_data_parallel.py: the ranks add their micro-batch gradients in
another order than one process, so metrics agree to rel 1e-5 and weights after two AdamW steps at lr 1e-2 to
atol 1e-3 * lr everywhere and 1e-6 on 99.9 % of the elements. The comparison is against the single-process update
with the same forward settings (FSDP2 ranks do not share prompts, see ``rank_settings``).
"""

from __future__ import annotations

import copy

import pytest
import torch

from drmas_train.algorithm.optim import build_optimizer
from drmas_train.algorithm.update import ppo_update
from helpers.lean_workers import ADV, OPTIM, base_model, grouped_samples, run, settings
from helpers.spawn_ranks import spawn_ranks

WORLD = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lean")
    spawn_ranks(run, WORLD, tmp)
    return torch.load(tmp / "lean.pt", weights_only=False)


def _single(share_prompts: bool):
    base = base_model()
    samples = grouped_samples(base)
    single = copy.deepcopy(base)
    metrics = ppo_update(single, build_optimizer("m", single, **OPTIM), samples, ADV,
                         settings().replace(share_prompts=share_prompts), pad_token_id=0, seed=7)  # fmt: skip
    return base, single, metrics


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp2", "ddp"])
def test_lean_rank_update_equals_single_process(ranks, strategy):
    got = ranks[strategy]
    shares = strategy == "ddp"
    assert got["share_prompts"] == shares  # rank_settings: FSDP2 ranks do not share prompts
    counts = got["counts"]
    assert counts["chunked_token_logprobs"] > 0 and counts["_plain_logprobs"] == 0  # chunked head on the rank
    assert (counts["shared_prompt_hidden"] > 0) == shares  # grouped prompts computed once (DDP only)
    base, single, expected = _single(share_prompts=shares)
    m = got["metrics"]
    assert m["steps"] == expected["steps"] == 2.0
    for key in ("grad_norm", "pg_loss", "ratio_mean"):
        assert m[key] == pytest.approx(expected[key], rel=1e-5), key
    want = single.state_dict()
    assert sorted(got["state"]) == sorted(want)
    moved = max(float((want[k] - base.state_dict()[k]).abs().max()) for k in want)
    assert moved > 1e-3  # the update really changed the weights
    diff = torch.cat([(got["state"][k] - v).abs().flatten() for k, v in want.items()])
    assert float(diff.max()) <= 1e-3 * OPTIM["lr"]
    assert float((diff <= 1e-6).float().mean()) >= 0.999


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp2", "ddp"])
def test_pi_old_recomputed_on_ranks_gives_a_first_ratio_of_exactly_one(ranks, strategy):
    got = ranks[strategy]
    ratios = torch.cat(got["ratios"])  # every loss call of both ranks (one mini-batch: the first step only)
    samples = grouped_samples(base_model())
    assert ratios.numel() == sum(len(s.response_ids) for s, a in zip(samples, ADV, strict=True) if a != 0)
    assert torch.equal(ratios, torch.ones_like(ratios))  # bitwise, every token
    assert got["second"]["ratio_mean"] == 1.0
    assert got["drift"]["old_logprob_abs_diff_max"] > 0  # the weights moved since the samples' π_old


def test_call_as_forward_runs_the_hooks_around_fn_and_restores_forward():
    from drmas_train.distributed.data_parallel import call_as_forward

    module = torch.nn.Linear(3, 2)
    seen = []
    module.register_forward_pre_hook(lambda mod, args: seen.append("pre"))
    module.register_forward_hook(lambda mod, args, out: seen.append(("post", out)))
    assert call_as_forward(module, lambda: seen.append("fn") or 42) == 42
    assert seen == ["pre", "fn", ("post", 42)]
    assert "forward" not in vars(module)  # the class's forward is back
    x = torch.ones(1, 3)
    assert torch.equal(module(x), x @ module.weight.T + module.bias)
    with pytest.raises(ValueError, match="boom"):
        call_as_forward(module, lambda: (_ for _ in ()).throw(ValueError("boom")))
    assert "forward" not in vars(module)  # restored after an error too
