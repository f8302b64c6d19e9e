"""PPO with a critic and the recipes around the loss, against the Dr. MAS reference's own functions.

The reference functions are re-implemented in torch from their file:line in ``reference_losses.py``. Both sides run
on random tables held back for this test (seeds 9301-9305, used nowhere else): 6-12 responses of 1-7 tokens
(right-padded), per-token values, log-probs and returns. Agreement is required to 1e-6 (the tables are float64, so
this tests the definitions, not float32 rounding).

What is compared: GAE advantages (whitened) and returns; the clipped value loss and its clip fraction under every
aggregation; the policy loss with DAPO's clip-higher (asymmetric clips, dual clip); the KL estimators k1 / k2 / k3;
the KL in the reward (token rewards, the controller's input and its update) with the fixed and the adaptive
controller; DAPO's overlong penalty; and DAPO's dynamic-sampling group filter.

One difference, by choice and shown separately: the reference masks its critic's values with the attention mask
shifted by one token (``verl/workers/critic/dp_critic.py:175``), so a response shorter than the padded length keeps
one value past its end; drmas masks them with the response mask (the call's end is terminal). On values that are 0
past each response's end (what drmas feeds GAE) the two GAEs agree.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fidelity.reference_losses as ref
from drmas_train.algorithm.advantages import gae_estimator
from drmas_train.algorithm.gae import call_token_rewards, gae
from drmas_train.algorithm.losses import PolicyLossConfig, kl_penalty, policy_loss, value_loss
from drmas_train.algorithm.reward_shaping import (
    AdaptiveKLController,
    FixedKLController,
    kl_reward_penalty,
    overlong_penalty,
)
from drmas_train.collect.dynamic_sampling import groups_with_spread

SEEDS = (9301, 9302, 9303, 9304, 9305)
ATOL = 1e-6
AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def table(seed: int) -> dict:
    """One held-back batch: B responses of 1-7 tokens with per-token values, rewards at the last token (some calls
    penalised), log-probs of pi_old / pi_ref / pi_theta, returns and (B,) scores."""
    rng = np.random.default_rng(seed)
    b = int(rng.integers(6, 13))
    lengths = rng.integers(1, 8, size=b)
    t = int(lengths.max())
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float64)
    scores = rng.choice([0.0, 1.0, 0.5, -0.1, 0.9], size=b)
    return {
        "lengths": lengths,
        "mask": mask,
        "scores": scores,
        "values": rng.normal(0.3, 0.4, size=(b, t)) * mask,
        "old_values": rng.normal(0.3, 0.4, size=(b, t)) * mask,
        "returns": rng.normal(0.5, 0.6, size=(b, t)) * mask,
        "old_logprobs": -rng.gamma(1.0, 1.0, size=(b, t)) * mask,
        "ref_logprobs": -rng.gamma(1.0, 1.0, size=(b, t)) * mask,
        "logprobs": -rng.gamma(1.0, 1.0, size=(b, t)) * mask,
        "advantages": rng.normal(size=(b, t)) * mask,
    }


def rows(a: np.ndarray, lengths) -> list[np.ndarray]:
    return [a[i, :n] for i, n in enumerate(lengths)]


def t64(a) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a), dtype=torch.float64)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_advantages_and_returns(seed, gamma, lam):
    t = table(seed)
    rewards = call_token_rewards(t["scores"], t["lengths"])  # the call's score at its last response token
    want_adv, want_ret = ref.compute_gae_advantage_return(
        t64(rewards), t64(t["values"]), t64(t["mask"]), gamma, lam
    )
    got = gae_estimator(t["scores"], uid=["u"] * len(t["scores"]), agent_id=["a"] * len(t["scores"]),
                        values=rows(t["values"], t["lengths"]), gamma=gamma, lam=lam)  # fmt: skip
    m = t["mask"].astype(bool)
    np.testing.assert_allclose(got[m], want_adv.numpy()[m], atol=ATOL)
    _, returns = gae(rewards, t["values"], t["mask"], gamma=gamma, lam=lam)
    np.testing.assert_allclose(returns[m], want_ret.numpy()[m], atol=ATOL)


def test_gae_with_the_references_shifted_value_mask_differs_past_the_response_end():
    """The reference's critic keeps the value of the state after a short response's last token (its shifted mask);
    with lambda < 1 its GAE bootstraps from it, drmas's does not. With that value 0 they agree (above); here it is
    not. At lambda = gamma = 1 (the reference's defaults) the extra value cancels out (the reference's GAE also runs
    over that padded position), so the two agree on every real token even then."""
    lengths = np.array([2, 4])
    values = np.array(
        [[0.2, 0.4, 0.7, 0.0], [0.1, 0.3, 0.5, 0.6]]
    )  # row 0 keeps V = 0.7 one token past its end
    mask = (np.arange(4)[None, :] < lengths[:, None]).astype(np.float64)
    rewards = call_token_rewards([1.0, 0.0], lengths)
    _, ref_returns = ref.compute_gae_advantage_return(t64(rewards), t64(values), t64(mask), 1.0, 0.5)
    _, returns = gae(rewards, values, mask, gamma=1.0, lam=0.5)
    # reference: A_2 = 0 - 0.7 (the padded position), A_1 = (1 + 0.7 - 0.4) + 0.5 A_2 = 0.95, R_1 = A_1 + 0.4
    assert ref_returns[0, 1].item() == pytest.approx(1.35)
    assert returns[0, 1] == pytest.approx(1.0)  # drmas: the call's end is terminal, R_1 = r = 1
    np.testing.assert_allclose(returns[1], ref_returns[1].numpy(), atol=ATOL)  # a full-length row is the same
    _, ref_mc = ref.compute_gae_advantage_return(t64(rewards), t64(values), t64(mask), 1.0, 1.0)
    _, mc = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    np.testing.assert_allclose(mc[mask > 0], ref_mc.numpy()[mask > 0], atol=ATOL)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("clip", [0.5, 0.2, 0.05])
def test_clipped_value_loss(seed, agg, clip):
    t = table(seed)
    want, want_clipfrac = ref.compute_value_loss(t64(t["values"]), t64(t["returns"]), t64(t["old_values"]),
                                                 t64(t["mask"]), clip, agg)  # fmt: skip
    got, metrics = value_loss(
        t64(t["values"]), t64(t["old_values"]), t64(t["returns"]), t64(t["mask"]), clip=clip, agg=agg
    )
    assert got.item() == pytest.approx(want.item(), abs=ATOL)
    assert metrics["vf_clipfrac"] == pytest.approx(want_clipfrac.item(), abs=ATOL)
    assert metrics["vf_loss"] == pytest.approx(want.item(), abs=ATOL)


def test_unclipped_value_loss_is_the_squared_error():
    t = table(SEEDS[0])
    got, metrics = value_loss(t64(t["values"]), t64(t["old_values"]), t64(t["returns"]), t64(t["mask"]), clip=None,
                              agg="token-mean")  # fmt: skip
    m = t["mask"].astype(bool)
    assert got.item() == pytest.approx(np.mean((t["values"][m] - t["returns"][m]) ** 2), abs=1e-12)
    assert metrics["vf_clipfrac"] == 0.0


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize(("low", "high"), [(0.2, 0.28), (0.1, 0.3), (0.2, 0.2)])
def test_clip_higher_policy_loss(seed, agg, low, high):
    t = table(seed)
    cfg = PolicyLossConfig(clip_low=low, clip_high=high, dual_clip_c=3.0, loss_agg=agg, kl_coef=0.0, kl_estimator="k3",
                           entropy_coef=0.0, behaviour_weight_cap=None)  # fmt: skip
    lp = t64(t["logprobs"]).requires_grad_(True)
    got, _ = policy_loss(lp, t64(t["old_logprobs"]), t64(t["advantages"]), t64(t["mask"]), cfg)
    lp_ref = t64(t["logprobs"]).requires_grad_(True)
    want, _, _, _ = ref.compute_policy_loss(t64(t["old_logprobs"]), lp_ref, t64(t["advantages"]), t64(t["mask"]),
                                            cliprange_low=low, cliprange_high=high, clip_ratio_c=3.0, loss_agg_mode=agg)  # fmt: skip
    assert got.item() == pytest.approx(want.item(), abs=ATOL)
    (g,) = torch.autograd.grad(got, lp)
    (g_ref,) = torch.autograd.grad(want, lp_ref)
    np.testing.assert_allclose(g.numpy(), g_ref.numpy(), atol=ATOL)  # the same tokens clipped on each side


def test_the_tables_clip_on_both_sides_of_the_asymmetric_range():
    """The clip-higher comparison above is not vacuous: ratios beyond 1 + 0.28 with A > 0 and below 1 - 0.2 with
    A < 0 occur in the held-back tables."""
    upper = lower = 0
    for seed in SEEDS:
        t = table(seed)
        ratio, m = np.exp(t["logprobs"] - t["old_logprobs"]), t["mask"].astype(bool)
        upper += int(((ratio > 1.28) & (t["advantages"] > 0) & m).sum())
        lower += int(((ratio < 0.8) & (t["advantages"] < 0) & m).sum())
    assert upper > 10 and lower > 10


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("ours", "theirs"), [("k1", "kl"), ("k2", "mse"), ("k3", "low_var_kl")])
def test_kl_estimators(seed, ours, theirs):
    t = table(seed)
    got = kl_penalty(t64(t["old_logprobs"]), t64(t["ref_logprobs"]), ours)
    want = ref.kl_penalty(t64(t["old_logprobs"]), t64(t["ref_logprobs"]), theirs)
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=ATOL)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("control", ["fixed", "adaptive"])
def test_kl_in_the_reward(seed, estimator, control):
    """Three iterations of the reference's apply_kl_penalty (token rewards, current_kl, controller update) against
    drmas's per-token penalties, summed per call for the call-level estimators."""
    t = table(seed)
    theirs = ref.FixedKLController(0.05) if control == "fixed" else ref.AdaptiveKLController(0.05, 0.02, 50)
    ours = (
        FixedKLController(0.05) if control == "fixed" else AdaptiveKLController(0.05, target=0.02, horizon=50)
    )
    scores = t64(
        call_token_rewards(t["scores"], t["lengths"])
    )  # token_level_scores: the score at the last token
    for step in range(3):
        old = t["old_logprobs"] * (1 + 0.3 * step)  # the KL grows, so the adaptive coefficient moves
        want_rewards, metrics = ref.apply_kl_penalty(scores, t64(old), t64(t["ref_logprobs"]), t64(t["mask"]), theirs,
                                                     estimator)  # fmt: skip
        penalty, mean_kl = kl_reward_penalty(rows(old, t["lengths"]), rows(t["ref_logprobs"], t["lengths"]),
                                             rows(t["mask"], t["lengths"]), estimator=estimator, coef=ours.value)  # fmt: skip
        assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(ours.value, abs=1e-12)
        assert mean_kl == pytest.approx(metrics["actor/reward_kl_penalty"], abs=ATOL)
        got_rewards = call_token_rewards(t["scores"], t["lengths"], penalty)
        m = t["mask"].astype(bool)
        np.testing.assert_allclose(got_rewards[m], want_rewards.numpy()[m], atol=ATOL)
        # what a call-level estimator reads: token_level_rewards.sum(-1) = score - beta * sum_t KL_t
        np.testing.assert_allclose(
            t["scores"] - [p.sum() for p in penalty], want_rewards.sum(-1).numpy(), atol=ATOL
        )
        ours.update(mean_kl, len(t["scores"]))
        assert ours.value == pytest.approx(theirs.value, rel=1e-9)
    if control == "adaptive":
        assert ours.value != 0.05


@pytest.mark.parametrize(("max_len", "buffer", "factor"), [(40, 10, 1.0), (256, 64, 0.5), (8, 8, 2.0)])
def test_overlong_penalty(max_len, buffer, factor):
    lengths = np.arange(0, max_len + 1)
    got = overlong_penalty(lengths, max_length=max_len, buffer=buffer, factor=factor)
    want = [ref.overlong_reward(int(n), max_len, buffer, factor) for n in lengths]
    np.testing.assert_allclose(got, want, atol=1e-12)
    assert got[max_len - buffer] == 0 and got[-1] == pytest.approx(-factor)


@pytest.mark.parametrize("seed", SEEDS)
def test_dynamic_sampling_keeps_the_references_groups(seed):
    rng = np.random.default_rng(seed)
    uids = [f"q{i}" for i in range(8) for _ in range(int(rng.integers(1, 5)))]
    scores = rng.choice([0.0, 1.0], size=len(uids), p=[0.7, 0.3])

    class T:  # a trajectory record's two fields the filter reads
        def __init__(self, uid, score):
            self.uid, self.score, self.won = uid, float(score), bool(score)

    trajectories = [T(u, s) for u, s in zip(uids, scores, strict=True)]
    assert groups_with_spread(trajectories, "score") == ref.kept_prompt_uids(uids, scores)
    assert groups_with_spread(trajectories, "won") == ref.kept_prompt_uids(uids, scores.astype(bool))


#: path -> {line: text the line holds}: the reference lines the docstrings and docs cite.
CITED_LINES = {
    "verl/trainer/ppo/core_algos.py": {
        35: "class AdaptiveKLController:",
        53: "class FixedKLController:",
        451: "def compute_gae_advantage_return(",
        492: "advantages = verl_F.masked_whiten(advantages, response_mask)",
        826: "def compute_policy_loss(",
        876: "torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)",
        907: "def compute_value_loss(",
        933: "vpredclipped = verl_F.clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)",
        942: "def kl_penalty(",
        960: 'if kl_penalty in ("mse", "k2"):',
    },
    "verl/trainer/ppo/ray_trainer.py": {
        155: "def apply_kl_penalty(",
        190: "token_level_rewards = token_level_scores - beta * kld",
        220: "reward_tensor[i, valid_response_length - 1] -= invalid_action_penalty_coef * action_invalids",
        1034: "self.critic_wg.save_checkpoint(critic_local_path",
        1087: "self.critic_wg.load_checkpoint(critic_path",
        1148: "self.global_steps += 1",
        1378: "critic_output = self.critic_wg.update_critic(batch)",
        1383: "if self.config.trainer.critic_warmup <= self.global_steps:",
    },
    "verl/workers/fsdp_workers.py": {890: "critic_module = AutoModelForTokenClassification.from_pretrained("},
    "verl/trainer/config/ppo_trainer.yaml": {
        197: "cliprange_value: 0.5",
        236: "lam: 1.0",
        258: "max_num_gen_batches: 10",
        279: "critic_warmup: 0",
    },  # fmt: skip
    "verl/workers/critic/dp_critic.py": {
        116: "values = values[:, -response_length - 1 : -1].squeeze(-1)",
        179: "def update_critic(self, data: DataProto):",
        175: "values = values * attention_mask[:, -response_length - 1 : -1]",
    },
    "verl/workers/reward_manager/dapo.py": {
        110: "overlong_reward = min(-exceed_len / overlong_buffer_len * overlong_penalty_factor, 0)"
    },
    "recipe/dapo/dapo_ray_trainer.py": {
        167: "if not self.config.algorithm.filter_groups.enable:",
        187: "kept_prompt_uids = [uid for uid, std in prompt_uid2metric_std.items() if std > 0 or len(prompt_uid2metric_vals[uid]) == 1]",
        210: "batch = batch[:traj_bsz]",
    },
    "agent_system/reward_manager/episode.py": {
        82: "reward_tensor[i, valid_response_length - 1] = torch.tensor(score"
    },
}


@pytest.mark.parametrize("path", sorted(CITED_LINES))
def test_the_cited_reference_lines_say_what_the_docstrings_claim(path):
    from fidelity.reference_mirror import reference_file

    lines = reference_file(path).splitlines()
    for number, text in CITED_LINES[path].items():
        assert text in lines[number - 1], f"{path}:{number} is {lines[number - 1].strip()!r}"
