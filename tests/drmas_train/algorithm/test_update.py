"""PPO update per model: micro-batching is exact, pre-clip norms, non-finite norms skip the step."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from drmas_train.algorithm.optim import build_optimizer, micro_batches
from drmas_train.algorithm.settings import UpdateSettings
from drmas_train.algorithm.update import ppo_update
from drmas_train.collect.samples import Sample
from drmas_train.model.models import ModelSpec
from helpers.tiny_rl import tiny_loader


def _samples(model, n=6, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = rng.integers(4, 20, int(rng.integers(2, 6))).tolist()
        r = rng.integers(4, 20, int(rng.integers(1, 5))).tolist()
        out.append(Sample(f"u{i % 2}", f"t{i}", "a", "m", 0, 0, p, r, [0.0] * len(r), [1] * len(r)))
    from drmas_train.model.logprobs import forward_logprobs

    with torch.no_grad():  # on-policy: old log-probs from the same weights (ratio 1)
        lp, mask, _ = forward_logprobs(model, [s.prompt_ids for s in out], [s.response_ids for s in out], pad_token_id=0)
    for b, s in enumerate(out):
        s.old_logprobs = lp[b, : len(s.response_ids)].tolist()
    return out


#: float32 unit roundoff (2**-24): the scale of every tolerance below.
U = 2.0**-24
#: One batch and several micro-batches sum the same per-token gradient terms in a different order and blocking
#: (other padding, other matmul shapes), so each gradient element may differ by up to ~n*U*sum|terms| (the
#: standard float32 summation bound). Measured: <= 5.3*U*max|g| on 1 and 2 threads; 32 leaves ~6x headroom
#: while a real accounting error (a lost or doubled micro-batch, a wrong denominator) is >= 1e5 times larger.
GRAD_ULPS = 32


def _update_capturing_grads(model, samples, adv, agg, budget, lr):
    """Run one ``ppo_update``; return its metrics, the accumulated gradients just before the optimizer step (flat,
    float32) and the weights after it (flat)."""
    opt = build_optimizer("m", model, lr=lr, weight_decay=0.0)
    captured = []
    step = opt.step

    def capture_then_step():
        captured.append(torch.cat([p.grad.detach().flatten().clone() for p in model.parameters()]))
        return step()

    opt.step = capture_then_step
    m = ppo_update(model, opt, samples, adv, UpdateSettings.defaults(loss_agg=agg, micro_batch_tokens=budget), pad_token_id=0)
    assert len(captured) == 1  # one mini-batch: one optimizer step however many micro-batches
    return m, captured[0], torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batching_equals_full_batch(agg):
    """Micro-batching accumulates exactly the full batch's gradient (to float32 summation error), so the update
    is the same.

    Weights are compared through Adam's first step, w' = w - lr * g / (|g| + eps) (bias-corrected, no weight
    decay), whose sensitivity to the gradient is lr * eps / (|g| + eps)**2: up to lr / eps = 1e6 where |g| ~ eps.
    A fixed absolute tolerance on the weights is therefore a coin toss (it failed at 1.8e-6..3.6e-6 vs 1e-6 on a
    loaded machine); the gradient tolerance carried through that sensitivity is what float32 guarantees.
    """
    base = tiny_loader(ModelSpec("tiny"), "m").model
    samples = _samples(base)
    adv = np.array([1.0, -0.5, 0.3, -1.2, 0.8, 0.0])
    lr, eps = 1e-2, 1e-8  # eps: torch AdamW's default, used by build_optimizer
    assert build_optimizer("m", copy.deepcopy(base), lr=lr).optimizer.param_groups[0]["eps"] == eps
    m1, g1, w1 = _update_capturing_grads(copy.deepcopy(base), samples, adv, agg, 10_000, lr)  # one micro-batch
    m2, g2, w2 = _update_capturing_grads(copy.deepcopy(base), samples, adv, agg, 9, lr)  # several
    grad_tol = GRAD_ULPS * U * float(g1.abs().max())
    torch.testing.assert_close(g2, g1, rtol=0.0, atol=grad_tol)
    # Adam's step propagates the gradient tolerance (no element can differ by more than the two steps' extent,
    # 2 lr). Rounding, in each of the two runs: the step is ~8 float32 operations (m, v, two bias corrections, sqrt,
    # + eps, divide, * lr), each within U * lr, and w0 - step rounds at the scale of its operands, U (|w0| + lr):
    # 2 * (8 U lr + U (|w0| + lr)) <= 18 U lr + 2 U |w0|; measured <= 3 ulps where the step nearly cancels w0.
    w0 = torch.cat([p.detach().flatten() for p in base.parameters()])
    w_tol = torch.clamp(lr * eps * grad_tol / (g1.abs() + eps) ** 2, max=2 * lr) + U * (18 * lr + 2 * w0.abs())
    assert bool(((w1 - w2).abs() <= w_tol).all()), float(((w1 - w2).abs() - w_tol).max())
    assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=GRAD_ULPS * U)
    assert m1["pg_loss"] == pytest.approx(m2["pg_loss"], abs=GRAD_ULPS * U * max(1.0, abs(m1["pg_loss"])))
    assert m1["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and m1["clipfrac_upper"] == 0.0


def test_grad_norm_is_pre_clip_and_nonfinite_skips():
    model = tiny_loader(ModelSpec("tiny"), "m").model
    opt = build_optimizer("m", model, lr=1e-2, grad_clip=1e-3)
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.full_like(p, 1.0)
    expected = float(np.sqrt(sum(p.numel() for p in model.parameters())))
    norm, stepped = opt.step()
    assert stepped and norm == pytest.approx(expected, rel=1e-5)  # reported before clipping to 1e-3
    for p in model.parameters():
        p.grad = torch.full_like(p, float("nan"))
    after_first = [p.detach().clone() for p in model.parameters()]
    norm, stepped = opt.step()
    assert not stepped and np.isnan(norm) and opt.skipped_steps == 1
    assert all(torch.equal(a, p) for a, p in zip(after_first, model.parameters(), strict=False))
    assert not all(torch.equal(a, b) for a, b in zip(before, after_first, strict=False))


def test_micro_batches_fit_budget_and_cover_all():
    lengths = [5, 30, 7, 12, 12, 3, 40]
    mbs = micro_batches(lengths, 36)
    assert sorted(i for mb in mbs for i in mb) == list(range(7))
    for mb in mbs:
        assert len(mb) == 1 or max(lengths[i] for i in mb) * len(mb) <= 36
    assert [6] in mbs  # longer than the budget: alone
    with pytest.raises(ValueError, match="token_budget must be >= 1"):
        micro_batches(lengths, 0)


def test_optimizer_errors():
    model = tiny_loader(ModelSpec("tiny"), "m").model.requires_grad_(False)
    with pytest.raises(ValueError, match="model 'm' has no trainable parameters"):
        build_optimizer("m", model)


def test_skipping_zero_advantage_samples_is_exact():
    base = tiny_loader(ModelSpec("tiny"), "m").model
    samples = _samples(base, n=6, seed=1)
    adv = np.array([0.0, 1.5, 0.0, -0.7, 0.0, 0.0])
    weights, metrics = [], []
    for skip in (False, True):
        model = copy.deepcopy(base)
        opt = build_optimizer("m", model, lr=1e-2, weight_decay=0.01)
        for _ in range(2):  # two iterations so that AdamW moments and weight decay matter
            m = ppo_update(model, opt, samples, adv, UpdateSettings.defaults(micro_batch_tokens=12, skip_zero_advantage=skip),
                           pad_token_id=0)  # fmt: skip
        metrics.append(m)
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(weights[0], weights[1], atol=1e-7, rtol=1e-6)
    assert metrics[0]["pg_loss"] == pytest.approx(metrics[1]["pg_loss"], abs=1e-7)
    assert metrics[0]["grad_norm"] == pytest.approx(metrics[1]["grad_norm"], rel=1e-5)
    # all advantages zero: nothing to compute, the step still happens on zero gradients (decay, moments)
    model = copy.deepcopy(base)
    opt = build_optimizer("m", model, lr=1e-2)
    m = ppo_update(model, opt, samples, np.zeros(6), UpdateSettings.defaults(micro_batch_tokens=8192), pad_token_id=0)
    assert m["grad_norm"] == 0.0 and m["steps"] == 1.0 and "pg_loss" not in m
