"""PPO loss: gradient at ratio 1, clip / dual-clip switch points, aggregation golden values, KL estimators."""

from __future__ import annotations

import math

import pytest
import torch

from drmas_train.algorithm.losses import PolicyLossConfig, aggregate, kl_penalty, policy_loss
from drmas_train.algorithm.settings import UpdateSettings


def loss_cfg(**changes) -> PolicyLossConfig:
    """The config's default loss settings with ``changes`` (defaults live in the algorithm config only)."""
    return UpdateSettings.defaults(**changes).loss


def _one_token(ratio: float, adv: float, cfg: PolicyLossConfig | None = None):
    old = torch.tensor([[math.log(0.5)]])
    lp = (old + math.log(ratio)).clone().requires_grad_(True)
    loss, metrics = policy_loss(lp, old, torch.tensor([adv]), torch.ones(1, 1), cfg or loss_cfg())
    loss.backward()
    return loss.item(), lp.grad.item(), metrics


def test_gradient_at_ratio_one_is_minus_advantage_times_grad_logpi():
    torch.manual_seed(0)
    V, B, T = 7, 3, 4
    theta = torch.randn(V, dtype=torch.float64)
    tokens = torch.randint(0, V, (B, T))
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([0.7, -1.3, 2.0], dtype=torch.float64)
    old = torch.log_softmax(theta, -1)[tokens].detach()  # ratio exactly 1 at theta

    def loss_at(th):
        return policy_loss(torch.log_softmax(th, -1)[tokens], old, adv, mask, loss_cfg())[0]

    # central finite differences of the loss
    h = 1e-6
    fd = torch.stack([(loss_at(theta + h * e) - loss_at(theta - h * e)) / (2 * h) for e in torch.eye(V, dtype=theta.dtype)])
    # -A * grad log pi, token-mean: grad log softmax(theta)[k] = onehot(k) - softmax(theta)
    p = torch.softmax(theta, -1)
    expected = torch.zeros(V, dtype=theta.dtype)
    for b in range(B):
        for t in range(T):
            if mask[b, t]:
                expected += -adv[b] * (torch.nn.functional.one_hot(tokens[b, t], V) - p)
    expected /= mask.sum()
    torch.testing.assert_close(fd, expected, atol=1e-7, rtol=1e-6)
    th = theta.clone().requires_grad_(True)
    loss_at(th).backward()
    torch.testing.assert_close(th.grad, expected, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize(
    "ratio, adv, loss, grad",
    [
        (1.1, 1.0, -1.1, -1.1),  # inside the clip range: loss -A r, d/dlogp = -A r
        (1.3, 1.0, -1.2, 0.0),  # above 1 + clip_high with A > 0: clipped, no gradient
        (0.5, 1.0, -0.5, -0.5),  # below 1 - clip_low with A > 0: unclipped (pessimistic min)
        (0.7, -1.0, 0.8, 0.0),  # below 1 - clip_low with A < 0: clipped
        (2.0, -1.0, 2.0, 2.0),  # large ratio, A < 0, below the dual bound c = 3
        (2.9, -1.0, 2.9, 2.9),
        (3.1, -1.0, 3.0, 0.0),  # dual clip: loss bounded by -A c = 3
        (10.0, -2.0, 6.0, 0.0),
    ],
)
def test_clip_and_dual_clip_switch(ratio, adv, loss, grad):
    got_loss, got_grad, _ = _one_token(ratio, adv)
    assert got_loss == pytest.approx(loss, abs=1e-5)
    assert got_grad == pytest.approx(grad, abs=1e-5)


def test_asymmetric_clip_and_metrics():
    cfg = loss_cfg(clip_low=0.2, clip_high=0.28)
    assert _one_token(1.25, 1.0, cfg)[0] == pytest.approx(-1.25, abs=1e-6)
    assert _one_token(1.3, 1.0, cfg)[0] == pytest.approx(-1.28, abs=1e-6)
    assert _one_token(0.75, -1.0, cfg)[0] == pytest.approx(0.8, abs=1e-6)
    # metrics over 4 tokens: one clipped above (A>0), one clipped below (A<0), one dual-clipped
    old = torch.zeros(1, 4)
    lp = torch.log(torch.tensor([[1.0, 1.5, 0.5, 4.0]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    _, m = policy_loss(lp, old, adv, torch.ones(1, 4), cfg)
    assert m["clipfrac_upper"] == 0.25 and m["clipfrac_lower"] == 0.25 and m["dual_clipfrac"] == 0.25
    assert m["ratio_mean"] == pytest.approx(7.0 / 4)
    # no dual clip: the A<0, ratio 4 token is not bounded
    assert _one_token(4.0, -1.0, loss_cfg(dual_clip_c=None))[0] == pytest.approx(4.0, abs=1e-5)


def test_aggregation_golden_values_and_accumulation():
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    m = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert float(aggregate(v, m, "token-mean")) == 2.5  # (1+2+3+4)/4
    assert float(aggregate(v, m, "seq-mean-token-mean")) == 3.0  # (2 + 4)/2
    assert float(aggregate(v, m, "seq-mean-token-sum")) == 5.0  # (6 + 4)/2
    # micro-batches with the full batch's denominator sum to the full-batch value
    assert float(aggregate(v[:1], m[:1], "token-mean", denom=4) + aggregate(v[1:], m[1:], "token-mean", denom=4)) == 2.5
    parts = [aggregate(v[i : i + 1], m[i : i + 1], "seq-mean-token-sum", denom=2) for i in range(2)]
    assert float(sum(parts)) == 5.0
    with pytest.raises(ValueError, match=r"unknown loss aggregation 'mean'; accepted: \['token-mean'"):
        aggregate(v, m, "mean")


def test_kl_estimators_and_penalty():
    lp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    assert float(kl_penalty(lp, ref, "k1")) == pytest.approx(math.log(2))
    assert float(kl_penalty(lp, ref, "k3")) == pytest.approx(0.5 + math.log(2) - 1)  # r = 1/2: r - log r - 1
    assert float(kl_penalty(lp, lp, "k3")) == 0.0
    assert float(kl_penalty(lp, ref, "k2")) == pytest.approx(0.5 * math.log(2) ** 2)  # (log r)^2 / 2
    cfg = loss_cfg(kl_coef=0.1, kl_estimator="k1", entropy_coef=0.01)
    ent = torch.tensor([[2.0]])
    loss, m = policy_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 1), cfg, entropy=ent, ref_logprobs=ref)
    assert float(loss) == pytest.approx(-1.0 + 0.1 * math.log(2) - 0.01 * 2.0)
    assert m["kl"] == pytest.approx(math.log(2)) and m["entropy"] == 2.0 and m["approx_kl"] == 0.0


def test_config_and_input_errors():
    with pytest.raises(ValueError, match=r"^kl_estimator='k4'; accepted: \['k1', 'k2', 'k3'\]"):
        loss_cfg(kl_estimator="k4")
    with pytest.raises(ValueError, match="dual_clip_c must be > 1"):
        loss_cfg(dual_clip_c=1.0)
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="kl_coef != 0 needs ref_logprobs"):
        policy_loss(x, x, torch.zeros(2), torch.ones(2, 3), loss_cfg(kl_coef=0.1))
    with pytest.raises(ValueError, match="entropy_coef != 0 needs the token entropies"):
        policy_loss(x, x, torch.zeros(2), torch.ones(2, 3), loss_cfg(entropy_coef=0.1))
    with pytest.raises(ValueError, match=r"must have the same \(B, T\) shape"):
        policy_loss(x, x[:, :2], torch.zeros(2), torch.ones(2, 3), loss_cfg())
