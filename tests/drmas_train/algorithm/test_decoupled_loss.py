"""The decoupled PPO objective (Hilton, Cobbe & Schulman 2022; AReaL): reduction to today's loss, golden numbers,
detached weight, config and input errors, and the update's wiring of the engine's log-probs as pi_behav."""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch

from drmas_train.algorithm.config import AlgorithmConfig, OptimConfig
from drmas_train.algorithm.losses import PolicyLossConfig, behaviour_weight, policy_loss
from drmas_train.algorithm.old_logprobs import recompute_old_logprobs
from drmas_train.algorithm.optim import ModelOptimizer
from drmas_train.algorithm.settings import UpdateSettings
from drmas_train.algorithm.update import check_behaviour_logprobs, ppo_update
from drmas_train.collect.samples import Sample
from drmas_train.errors import ConfigError
from drmas_train.model.logprobs import forward_logprobs
from drmas_train.model.models import load_model


def loss_cfg(**changes) -> PolicyLossConfig:
    return UpdateSettings.defaults(**changes).loss


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 6
    old = -torch.rand(B, T, generator=g) * 3  # (B, T) log pi_prox
    logprobs = (old + 0.4 * torch.randn(B, T, generator=g)).clamp(max=0.0)  # ratios around 1, several clipped
    adv = torch.randn(B, generator=g)
    mask = torch.ones(B, T)
    mask[1, 4:] = 0
    mask[3, 2:] = 0
    return logprobs, old, adv, mask


def _loss_and_grad(logprobs, old, adv, mask, cfg, **kwargs):
    lp = logprobs.clone().requires_grad_(True)
    loss, metrics = policy_loss(lp, old, adv, mask, cfg, **kwargs)
    loss.backward()
    return loss.detach(), lp.grad, metrics


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("dual_clip_c", [None, 3.0])
@pytest.mark.parametrize("denom", [None, 7.0, "rows"])
def test_no_staleness_gives_todays_loss_and_gradient_bitwise(agg, dual_clip_c, denom):
    """eta = 0: pi_behav = pi_prox, so w = exp(0) = 1 exactly and w * L = L bit for bit (IEEE x * 1.0 = x)."""
    logprobs, old, adv, mask = _batch()
    d = torch.tensor([2.0, 3.0, 5.0, 4.0]) if denom == "rows" else denom
    today = loss_cfg(loss_agg=agg, dual_clip_c=dual_clip_c)
    decoupled = dataclasses.replace(today, behaviour_weight_cap=2.0)
    loss0, grad0, m0 = _loss_and_grad(logprobs, old, adv, mask, today, denom=d)
    loss1, grad1, m1 = _loss_and_grad(
        logprobs, old, adv, mask, decoupled, denom=d, behav_logprobs=old.clone()
    )
    assert torch.equal(loss0, loss1)
    assert torch.equal(grad0, grad1)
    assert grad0.abs().max() > 0 and m0["clipfrac_upper"] + m0["clipfrac_lower"] > 0  # the clip was exercised
    assert {k: v for k, v in m1.items() if not k.startswith("behaviour_")} == m0
    assert m1["behaviour_weight_mean"] == 1.0 and m1["behaviour_weight_capped"] == 0.0
    assert m1["behaviour_approx_kl"] == 0.0


def _one_token(ratio: float, adv: float, prox_p: float, behav_p: float, cap: float, **changes):
    prox = torch.tensor([[math.log(prox_p)]])
    behav = torch.tensor([[math.log(behav_p)]])
    lp = (prox + math.log(ratio)).clone().requires_grad_(True)
    cfg = loss_cfg(behaviour_weight_cap=cap, **changes)
    loss, metrics = policy_loss(lp, prox, torch.tensor([adv]), torch.ones(1, 1), cfg, behav_logprobs=behav)
    loss.backward()
    return loss.item(), lp.grad.item(), metrics


@pytest.mark.parametrize(
    ("ratio", "adv", "prox_p", "behav_p", "cap", "loss", "grad", "weight", "capped"),
    [
        # unclipped (r = 1.1 < 1.2): L = -A r w, dL/dlogp = -A r w; w = 0.5 / 0.25 = 2 under cap 3
        (1.1, 1.0, 0.5, 0.25, 3.0, -2.2, -2.2, 2.0, 0.0),
        # the same with the cap truncating w = 2 to 1.5
        (1.1, 1.0, 0.5, 0.25, 1.5, -1.65, -1.65, 1.5, 1.0),
        # clipped at 1 + 0.2 (r = 1.5, A > 0): L = -1.2 A w, no gradient
        (1.5, 1.0, 0.5, 0.25, 1.5, -1.8, 0.0, 1.5, 1.0),
        # dual clip (A = -1, r = 4 > c = 3): L = -A c w = 3 w with w = 0.25 / 0.5 = 0.5 (a fresher behaviour policy)
        (4.0, -1.0, 0.25, 0.5, 2.0, 1.5, 0.0, 0.5, 0.0),
        # A < 0 below the dual clip (r = 2): L = -A r w = 2 * 0.5 = 1, dL/dlogp = -A r w = 1
        (2.0, -1.0, 0.25, 0.5, 2.0, 1.0, 1.0, 0.5, 0.0),
    ],
)
def test_golden_one_token(ratio, adv, prox_p, behav_p, cap, loss, grad, weight, capped):
    got_loss, got_grad, m = _one_token(ratio, adv, prox_p, behav_p, cap)
    assert got_loss == pytest.approx(loss, rel=1e-6)
    assert got_grad == pytest.approx(grad, rel=1e-6, abs=1e-7)
    assert m["behaviour_weight_mean"] == pytest.approx(weight, rel=1e-6)
    assert m["behaviour_weight_capped"] == capped


def test_golden_two_tokens_token_mean_with_mask():
    """Token 0: r = 1.1, A = 1, w = 2; token 1: r = 1, A = -0.5, w = 4 capped at 3; token 2 masked out (w = 8)."""
    prox = torch.log(torch.tensor([[0.5, 0.8, 0.8]]))
    behav = torch.log(torch.tensor([[0.25, 0.2, 0.1]]))
    lp = prox + torch.log(torch.tensor([[1.1, 1.0, 1.0]]))
    adv = torch.tensor([[1.0, -0.5, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    cfg = loss_cfg(behaviour_weight_cap=3.0)
    loss, m = policy_loss(lp, prox, adv, mask, cfg, behav_logprobs=behav)
    assert loss.item() == pytest.approx((-1.1 * 2.0 + 0.5 * 1.0 * 3.0) / 2, rel=1e-6)  # -0.35
    assert m["behaviour_weight_mean"] == pytest.approx((2.0 + 3.0) / 2, rel=1e-6)
    assert m["behaviour_weight_capped"] == 0.5
    # k3 estimate of KL(pi_behav || pi_prox) from pi_behav's samples: w - log w - 1 with the uncapped w = p_prox / p_behav
    k3 = [pp / pb - math.log(pp / pb) - 1 for pp, pb in ((0.5, 0.25), (0.8, 0.2))]
    assert m["behaviour_approx_kl"] == pytest.approx(sum(k3) / 2, rel=1e-5)


def test_weight_is_detached():
    logprobs, old, adv, mask = _batch(1)
    prox = old.clone().requires_grad_(True)
    behav = (old - 0.3).requires_grad_(True)
    lp = logprobs.clone().requires_grad_(True)
    w = behaviour_weight(prox, behav, 5.0)
    assert not w.requires_grad
    cfg = loss_cfg(behaviour_weight_cap=5.0)
    loss, _ = policy_loss(lp, prox, adv, mask, cfg, behav_logprobs=behav)
    loss.backward()
    assert behav.grad is None  # no path from the loss to pi_behav
    # d/dlogp of w * L = w * dL/dlogp: the weighted gradient is today's gradient times the (constant) weight
    _, grad_today, _ = _loss_and_grad(logprobs, old, adv, mask, loss_cfg())
    torch.testing.assert_close(lp.grad, grad_today * w, rtol=1e-6, atol=1e-9)
    assert not torch.equal(lp.grad, grad_today)


def test_config_and_input_errors():
    with pytest.raises(ValueError, match="behaviour_weight_cap must be >= 1 or null"):
        loss_cfg(behaviour_weight_cap=0.5)
    with pytest.raises(ConfigError, match="algorithm.behaviour_weight_cap must be >= 1"):
        AlgorithmConfig(behaviour_weight_cap=0.9).validate()
    with pytest.raises(ConfigError, match="needs algorithm.recompute_old_logprobs: true"):
        AlgorithmConfig(behaviour_weight_cap=2.0, recompute_old_logprobs=False).validate()
    AlgorithmConfig(behaviour_weight_cap=2.0).validate()
    settings = UpdateSettings.from_config(
        AlgorithmConfig(behaviour_weight_cap=2.0), OptimConfig(), temperature=1.0
    )
    assert settings.loss.behaviour_weight_cap == 2.0
    logprobs, old, adv, mask = _batch()
    with pytest.raises(ValueError, match="no behav_logprobs were given"):
        policy_loss(logprobs, old, adv, mask, loss_cfg(behaviour_weight_cap=2.0))
    with pytest.raises(ValueError, match=r"behav_logprobs \(4, 5\) must have the \(B, T\) shape \(4, 6\)"):
        policy_loss(logprobs, old, adv, mask, loss_cfg(behaviour_weight_cap=2.0), behav_logprobs=old[:, :5])
    ok = Sample("u", "t0", "a", "m", 0, 0, [1], [5, 6], [-1.0, -2.0], [1, 1])
    check_behaviour_logprobs([ok])
    missing = dataclasses.replace(
        ok, traj_uid="t1", model_id="router", old_logprobs=[]
    )  # e.g. a server without logprobs
    with pytest.raises(ValueError, match=r"model 'router' \(agent 'a', traj_uid 't1'\) has 0 for 2 tokens"):
        check_behaviour_logprobs([ok, missing])


def _sgd(model):
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    return ModelOptimizer("m", opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0), grad_clip=1e9)


def _samples(model, seed=0):
    rng = np.random.default_rng(seed)
    vocab = model.config.vocab_size
    out = []
    for g in range(2):
        prompt = rng.integers(5, vocab, 5).tolist()
        for k in range(3):
            r = rng.integers(5, vocab, int(rng.integers(2, 5))).tolist()
            out.append(Sample(f"u{g}", f"t{g}-{k}", "a", "m", 0, 0, prompt, r, [0.0] * len(r), [1] * len(r)))
    with torch.no_grad():
        lp, _, _ = forward_logprobs(
            model, [s.prompt_ids for s in out], [s.response_ids for s in out], pad_token_id=0
        )
    for b, s in enumerate(out):
        s.old_logprobs = (lp[b, : len(s.response_ids)] - 0.05 * (b + 1)).tolist()  # an engine that differs
    return out


def _flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_update_reads_the_engines_logprobs_as_behaviour_policy():
    """recompute_old_logprobs keeps the engine's log-probs (pi_behav) beside the recomputed pi_old (pi_prox); the
    decoupled update weights each token by min(pi_prox / pi_behav, cap); with the engine's log-probs equal to the
    recomputation it steps exactly as today's update."""
    base = load_model("tiny-llama").model
    samples = _samples(base)
    adv = np.array([1.0, -0.5, 0.3, -1.2, 0.8, 0.4])
    settings = UpdateSettings.defaults(micro_batch_tokens=8192, mini_batches=1, loss_micro_batch_size=None)
    recomputed, _ = recompute_old_logprobs(base, samples, settings, pad_token_id=0)
    for s, r in zip(samples, recomputed, strict=True):
        assert r.rollout_logprobs == s.old_logprobs and r.behaviour_logprobs == s.old_logprobs
        assert r.old_logprobs != s.old_logprobs
    again, _ = recompute_old_logprobs(
        base, recomputed, settings, pad_token_id=0
    )  # a second recompute keeps them
    assert [s.rollout_logprobs for s in again] == [s.old_logprobs for s in samples]

    def step(cfg, batch):
        model = copy.deepcopy(base)
        before = _flat(model)
        metrics = ppo_update(model, _sgd(model), batch, adv, cfg, pad_token_id=0)
        return before - _flat(model), metrics

    today, m_today = step(settings, recomputed)
    fresh = [
        dataclasses.replace(s, rollout_logprobs=list(s.old_logprobs)) for s in recomputed
    ]  # pi_behav = pi_prox
    same, m_same = step(settings.replace(behaviour_weight_cap=2.0), fresh)
    assert torch.equal(today, same) and today.abs().max() > 0
    assert m_same["behaviour_weight_mean"] == 1.0
    stale, m_stale = step(settings.replace(behaviour_weight_cap=2.0), recomputed)
    assert not torch.equal(today, stale)
    # the engine was 0.05 (b + 1) nats below the trainer: w = exp(0.05 (b + 1)), all under the cap of 2
    w = [math.exp(0.05 * (b + 1)) for b in range(6)]
    n = [len(s.response_ids) for s in samples]
    assert m_stale["behaviour_weight_mean"] == pytest.approx(
        sum(wi * ni for wi, ni in zip(w, n, strict=True)) / sum(n), rel=1e-5
    )
    assert m_stale["behaviour_weight_capped"] == 0.0


def test_the_option_runs_in_the_trainer_and_checks_its_config(tmp_path):
    from drmas_train.run.config import ConfigError as RunConfigError
    from drmas_train.run.metrics_log import read_metrics
    from drmas_train.run.trainer import train
    from helpers.tiny_rl import tiny_config, tiny_loader

    run_dir = tmp_path / "run"
    train(tiny_config(run_dir, "run.iterations=1", "algorithm.behaviour_weight_cap=2.0"), loader=tiny_loader)
    row = read_metrics(run_dir / "metrics.jsonl")[-1]
    # the HF engine and the trainer compute the same log-probs up to float noise: w = pi_prox / pi_behav ~ 1
    assert (
        abs(row["loss/m/behaviour_weight_mean"] - 1.0) < 1e-3 and row["loss/m/behaviour_weight_capped"] == 0.0
    )
    assert row["loss/m/grad_norm"] > 0
    with pytest.raises(RunConfigError, match="needs algorithm.recompute_old_logprobs: true"):
        tiny_config(
            tmp_path / "bad", "algorithm.behaviour_weight_cap=2.0", "algorithm.recompute_old_logprobs=false"
        )
