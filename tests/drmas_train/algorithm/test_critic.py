"""PPO with a critic: the value model, its per-token values, its update, its checkpoint, and the trainer with
``algorithm.estimator: gae`` (critic warm-up, one critic per model or per agent), and a CPU run in which the critic
learns (value error falls, explained variance rises)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from drmas_train.algorithm.config import CriticConfig
from drmas_train.algorithm.critic import (
    build_critic,
    critic_keys,
    critic_of,
    critic_values,
    shares_value_prompts,
    value_update,
)
from drmas_train.algorithm.gae import pad_rows
from drmas_train.algorithm.optim import ModelOptimizer
from drmas_train.algorithm.settings import CriticSettings, UpdateSettings
from drmas_train.collect.samples import Sample
from drmas_train.model.models import load_model
from drmas_train.model.value_model import ValueModel, forward_values
from drmas_train.run.checkpoint import load_critic_states, save_critic_states
from drmas_train.run.config import ConfigError, load_config
from drmas_train.run.metrics_log import read_metrics
from drmas_train.run.trainer import train
from helpers.tiny_rl import tiny_config, tiny_loader

SETTINGS = UpdateSettings.defaults(critic=CriticSettings(value_clip=0.5))


def _samples(vocab: int, n: int = 6, seed: int = 0) -> list[Sample]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = rng.integers(5, vocab, int(rng.integers(3, 7))).tolist()
        r = rng.integers(5, vocab, int(rng.integers(1, 6))).tolist()
        out.append(Sample(f"u{i % 2}", f"t{i}", "a", "m", 0, 0, p, r, [0.0] * len(r), [1] * len(r)))
    return out


def _sgd(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return ModelOptimizer("critic", opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0), grad_clip=1e9)


def test_value_model_is_a_copy_with_a_seeded_head():
    lm = load_model("tiny-llama").model
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    a, b = ValueModel.from_causal_lm(lm, seed=3), ValueModel.from_causal_lm(lm, seed=3)
    torch.testing.assert_close(a.value_head.weight, b.value_head.weight)  # the seed fixes the head
    assert not torch.equal(a.value_head.weight, ValueModel.from_causal_lm(lm, seed=4).value_head.weight)
    assert float(a.value_head.bias.detach()) == 0.0 and all(p.requires_grad for p in a.parameters())
    with torch.no_grad():
        for p in a.parameters():
            p.add_(1.0)  # the critic's weights are its own
    for k, v in lm.state_dict().items():
        torch.testing.assert_close(v, before[k])
    torch.testing.assert_close(a.decoder.embed_tokens.weight, lm.get_decoder().embed_tokens.weight + 1.0)


def test_a_lora_policys_critic_starts_from_the_merged_weights():
    import copy

    from peft import LoraConfig, get_peft_model

    policy = get_peft_model(copy.deepcopy(load_model("tiny-llama").model),
                            LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))  # fmt: skip
    critic = ValueModel.from_causal_lm(policy, seed=0)
    ids = torch.tensor([[5, 6, 7, 8]])
    merged = copy.deepcopy(policy).merge_and_unload().get_decoder()
    torch.testing.assert_close(
        critic.decoder(input_ids=ids).last_hidden_state, merged(input_ids=ids).last_hidden_state
    )
    assert not any("lora" in n for n, _ in critic.named_parameters()) and all(
        p.requires_grad for p in critic.parameters()
    )
    assert all(
        ("lora" in n) == p.requires_grad for n, p in policy.named_parameters()
    )  # the policy is untouched


def test_values_are_read_at_the_position_before_each_response_token():
    critic = ValueModel.from_causal_lm(load_model("tiny-llama").model, seed=0).eval()
    samples = _samples(critic.config.vocab_size)
    values, mask = forward_values(
        critic, [s.prompt_ids for s in samples], [s.response_ids for s in samples], pad_token_id=0
    )
    for b, s in enumerate(
        samples
    ):  # alone, unpadded: V_t is the value at position P - 1 + t of prompt + response
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        full = critic(input_ids=ids).logits[0, :, 0]
        p, n = len(s.prompt_ids), len(s.response_ids)
        torch.testing.assert_close(values[b, :n], full[p - 1 : p - 1 + n], atol=1e-5, rtol=1e-5)
        assert mask[b].sum() == n and float(values[b, n:].abs().sum()) == 0.0
    got = critic_values(
        critic, samples, SETTINGS.replace(micro_batch_tokens=12), pad_token_id=0
    )  # micro-batched
    for b, s in enumerate(samples):
        np.testing.assert_allclose(got[b], values[b, : len(s.response_ids)].detach().numpy(), atol=1e-5)


def _group_samples(vocab: int, seed: int = 0) -> list[Sample]:
    """A group of three rollouts of one prompt, a group of two (one with an empty response) and a single row."""
    g = torch.Generator().manual_seed(seed)
    p1, p2 = torch.randint(5, vocab, (7,), generator=g).tolist(), torch.randint(5, vocab, (4,), generator=g).tolist()
    prompts = [p1, p1, p2, p1, p2, [3, 9]]
    responses = [torch.randint(5, vocab, (n,), generator=g).tolist() for n in (5, 3, 0, 6, 2, 4)]
    return [Sample(f"u{i}", f"t{i}", "a", "m", 0, 0, p, r, [0.0] * len(r), [1] * len(r))
            for i, (p, r) in enumerate(zip(prompts, responses, strict=True))]  # fmt: skip


def test_shared_prompt_values_and_gradients_equal_the_packed_forward():
    """``forward_values(share_prompts=True)`` computes each distinct prompt once (3 prefixes, not 6 prompts) and gives
    the packed forward's values and gradients to float32 rounding."""
    critic = ValueModel.from_causal_lm(load_model("tiny-llama").model, seed=0).train()
    samples = _group_samples(critic.config.vocab_size)
    prompts, responses = [s.prompt_ids for s in samples], [s.response_ids for s in samples]
    seen: list[tuple[int, ...]] = []
    hook = critic.decoder.embed_tokens.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    results = {}
    try:
        for share in (False, True):
            seen.clear()
            critic.zero_grad(set_to_none=True)
            values, mask = forward_values(critic, prompts, responses, pad_token_id=0, share_prompts=share)
            (values * torch.linspace(-1.0, 2.0, values.numel()).view_as(values)).sum().backward()
            grads = torch.cat([p.grad.flatten() for p in critic.parameters()])
            results[share] = (values.detach(), mask, grads, list(seen))
    finally:
        hook.remove()
    assert results[False][3] == [(6, 12)]  # 6 rows x (longest prompt 7 + longest response 6 - 1)
    assert results[True][3] == [(3, 6), (6, 6)]  # 3 distinct prompts minus their last token, then 6 rows x T = 6
    torch.testing.assert_close(results[True][1], results[False][1], rtol=0, atol=0)
    assert float(results[False][1][2].sum()) == 0.0  # the empty response has no value
    torch.testing.assert_close(results[True][0], results[False][0], rtol=1e-5, atol=1e-5)
    scale = results[False][2].abs().max()
    torch.testing.assert_close(results[True][2] / scale, results[False][2] / scale, rtol=0, atol=1e-5)


def test_critic_values_and_update_share_prompts_with_the_same_result():
    """``critic_values`` and ``value_update`` with ``share_prompts`` (prompt-grouped micro-batches, each prompt once)
    give the values and the SGD step of the unshared computation; activation checkpointing turns sharing off."""
    lm = load_model("tiny-llama").model
    samples = _group_samples(lm.config.vocab_size, seed=1)
    returns, _ = pad_rows([np.linspace(-1.0, 1.0, len(s.response_ids)) for s in samples])
    got = {}
    for share in (False, True):
        settings = SETTINGS.replace(share_prompts=share, micro_batch_tokens=30)
        critic = ValueModel.from_causal_lm(lm, seed=0)
        assert shares_value_prompts(critic, settings) is share
        before = [p.detach().clone() for p in critic.parameters()]
        values = critic_values(critic, samples, settings, pad_token_id=0)
        old, _ = pad_rows(values, returns.shape[1])
        out = value_update(critic, _sgd(critic), samples, old, returns, settings, pad_token_id=0)
        got[share] = (values, out["vf_loss"], [p.detach() - b for p, b in zip(critic.parameters(), before, strict=True)])
    for a, b in zip(got[False][0], got[True][0], strict=True):
        np.testing.assert_allclose(b, a, atol=1e-5)
    assert got[True][1] == pytest.approx(got[False][1], rel=1e-5)
    for a, b in zip(got[False][2], got[True][2], strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-4)
    critic = ValueModel.from_causal_lm(lm, seed=0)
    assert not shares_value_prompts(critic, SETTINGS.replace(activation_checkpointing=1))


def test_value_update_fits_the_returns():
    """Repeated updates on fixed returns: the value loss falls and the values approach the returns."""
    critic, opt = build_critic(
        load_model("tiny-llama").model, "m", CriticConfig(lr=1e-3), betas=[0.9, 0.999], seed=0, offload=False
    )
    samples = _samples(critic.config.vocab_size, n=8)
    returns, _ = pad_rows([np.linspace(-0.5, 1.0, len(s.response_ids)) * (1 if i % 2 else -1)
                           for i, s in enumerate(samples)])  # fmt: skip
    losses = []
    for it in range(40):
        old, _ = pad_rows(critic_values(critic, samples, SETTINGS, pad_token_id=0), returns.shape[1])
        out = value_update(critic, opt, samples, old, returns, SETTINGS, pad_token_id=0, seed=it)
        losses.append(out["vf_loss"])
    assert losses[-1] < 0.2 * losses[0], losses
    assert out["steps"] == 1.0 and out["grad_norm"] > 0 and 0.0 <= out["vf_clipfrac"] <= 1.0


def test_value_update_micro_batches_sum_to_the_full_batch_step():
    """Token-budget micro-batches accumulate the mini-batch loss exactly (SGD: equal weight steps)."""
    lm = load_model("tiny-llama").model
    samples = _samples(lm.config.vocab_size, n=6)
    returns, _ = pad_rows([np.full(len(s.response_ids), 0.7) for s in samples])
    steps = []
    for budget in (4096, 14):
        critic = ValueModel.from_causal_lm(lm, seed=0)
        before = [p.detach().clone() for p in critic.parameters()]
        old = np.zeros_like(returns)
        out = value_update(critic, _sgd(critic), samples, old, returns, SETTINGS.replace(micro_batch_tokens=budget),
                           pad_token_id=0)  # fmt: skip
        steps.append([p.detach() - b for p, b in zip(critic.parameters(), before, strict=True)])
        assert out["vf_loss"] > 0
    for a, b in zip(*steps, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_value_update_with_auto_budget_and_activation_checkpointing():
    """``micro_batch_tokens: auto`` probes the critic's own forward; activation checkpointing of the critic's decoder
    gives the same step (SGD: the step is the gradient)."""
    lm = load_model("tiny-llama").model
    samples = _samples(lm.config.vocab_size, n=4)
    returns, _ = pad_rows([np.full(len(s.response_ids), 0.5) for s in samples])
    steps = []
    for changes in ({"micro_batch_tokens": "auto"}, {"activation_checkpointing": 1}):
        critic = ValueModel.from_causal_lm(lm, seed=0)
        before = [p.detach().clone() for p in critic.parameters()]
        out = value_update(critic, _sgd(critic), samples, np.zeros_like(returns), returns, SETTINGS.replace(**changes),
                           pad_token_id=0)  # fmt: skip
        steps.append([p.detach() - b for p, b in zip(critic.parameters(), before, strict=True)])
        assert out["micro_batch_tokens"] >= max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    for a, b in zip(*steps, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_value_update_errors():
    critic = ValueModel.from_causal_lm(load_model("tiny-llama").model, seed=0)
    samples = _samples(critic.config.vocab_size, n=2)
    with pytest.raises(ValueError, match="needs settings.critic"):
        value_update(critic, _sgd(critic), samples, np.zeros((2, 9)), np.zeros((2, 9)), UpdateSettings.defaults(),
                     pad_token_id=0)  # fmt: skip
    with pytest.raises(ValueError, match=r"returns must be \(B=2, T >= \d\), got shape \(2, 1\)"):
        value_update(
            critic, _sgd(critic), samples, np.zeros((2, 9)), np.zeros((2, 1)), SETTINGS, pad_token_id=0
        )


def test_critic_keys_per_model_and_per_agent():
    agents = {"solver": "shared", "verifier": "shared", "judge": "frozen"}
    assert critic_keys(agents, ["shared"], "model") == {"solver": "shared", "verifier": "shared"}
    assert critic_keys(agents, ["shared"], "agent") == {"solver": "solver", "verifier": "verifier"}
    with pytest.raises(ValueError, match=r"critic per must be one of \['model', 'agent'\], got 'team'"):
        critic_keys(agents, ["shared"], "team")
    samples = [
        Sample("u", "t", a, "shared", 0, 0, [1], [2], [0.0], [1]) for a in ("solver", "judge", "verifier")
    ]
    assert critic_of({"solver": "c1", "verifier": "c2"}, samples) == {"c1": [0], "c2": [2]}


def test_critic_checkpoint_round_trip(tmp_path):
    lm = load_model("tiny-llama").model
    critic, opt = build_critic(lm, "m", CriticConfig(lr=1e-3), betas=[0.9, 0.999], seed=0, offload=False)
    samples = _samples(critic.config.vocab_size, n=4)
    returns, _ = pad_rows([np.ones(len(s.response_ids)) for s in samples])
    value_update(
        critic, opt, samples, np.zeros_like(returns), returns, SETTINGS, pad_token_id=0
    )  # Adam has state
    save_critic_states(tmp_path, {"m": (critic, opt)})
    other, other_opt = build_critic(lm, "m", CriticConfig(lr=1e-3), betas=[0.9, 0.999], seed=1, offload=False)
    load_critic_states(tmp_path, {"m": (other, other_opt)})
    for a, b in zip(critic.state_dict().values(), other.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b)
    assert other_opt.optimizer.state_dict()["state"].keys() == opt.optimizer.state_dict()["state"].keys()
    with pytest.raises(FileNotFoundError, match="has no critic 'other'"):
        load_critic_states(tmp_path, {"other": (other, other_opt)})
    with pytest.raises(ValueError, match="has no separate decoder"):
        ValueModel.from_causal_lm(critic.value_head, seed=0)


def test_critic_config_errors():
    for override, message in [
        ("critic.per=team", r"critic.per='team'; accepted: model, agent"),
        ("critic.value_clip=0", r"critic.value_clip must be > 0 or null"),
        ("critic.lr=0", r"critic.lr and critic.grad_clip must be > 0"),
        ("critic.warmup_iterations=-1", r"critic.warmup_iterations must be >= 0"),
        ("algorithm.lam=1.5", r"algorithm.lam must be in \[0, 1\]"),
        ("algorithm.grouping=prompt", r"gae has no group baseline; accepted: null"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config("quickstart_math", ["algorithm.estimator=gae", override])
    s = UpdateSettings.from_config(*(lambda c: (c.algorithm, c.optim))(load_config("quickstart_math_gae")),
                                   temperature=1.0, critic=CriticConfig(value_clip=0.2))  # fmt: skip
    assert s.critic == CriticSettings(value_clip=0.2)
    assert UpdateSettings.defaults().critic is None  # drmas: no critic


def test_trainer_gae_warm_up_then_policy_updates_and_checkpoint(tmp_path):
    run_dir = tmp_path / "gae"
    cfg = tiny_config(run_dir, "algorithm.estimator=gae", "run.iterations=3", "critic.warmup_iterations=2",
                      "critic.lr=1e-3")  # fmt: skip
    summary = train(cfg, loader=tiny_loader)
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    for r in rows:  # the critic trains every iteration
        assert r["critic/m/vf_loss"] > 0 and r["critic/m/steps"] == 1.0 and r["critic/m/lr"] == 1e-3
        assert "critic/a/explained_variance" in r and "critic/b/value_mse" in r
    assert not any(k.startswith("loss/m/") for k in rows[0]) and not any(
        k.startswith("loss/m/") for k in rows[1]
    )
    assert rows[2]["loss/m/grad_norm"] > 0  # the policy from iteration warmup_iterations + 1 on
    ckpt = summary["checkpoint"]
    assert (
        tmp_path / "gae" / "checkpoints" / "iter_000003" / "critics" / "m" / "value_model.safetensors"
    ).is_file()
    assert ckpt.endswith("iter_000003")


def test_trainer_one_critic_per_agent(tmp_path):
    run_dir = tmp_path / "per_agent"
    train(
        tiny_config(run_dir, "algorithm.estimator=gae", "run.iterations=1", "critic.per=agent"),
        loader=tiny_loader,
    )
    row = read_metrics(run_dir / "metrics.jsonl")[-1]
    assert row["critic/a/vf_loss"] > 0 and row["critic/b/vf_loss"] > 0 and "critic/m/vf_loss" not in row
    assert row["loss/m/grad_norm"] > 0
    assert {p.name for p in (run_dir / "checkpoints" / "iter_000001" / "critics").iterdir()} == {"a", "b"}


def test_trainer_gae_resume_restores_the_critic(tmp_path):
    run_dir = tmp_path / "resume"
    train(
        tiny_config(run_dir, "algorithm.estimator=gae", "run.iterations=1", "critic.lr=1e-3"),
        loader=tiny_loader,
    )
    from safetensors.torch import load_file

    saved = load_file(run_dir / "checkpoints" / "iter_000001" / "critics" / "m" / "value_model.safetensors")
    from drmas_train.run.trainer import build_run

    run = build_run(tiny_config(run_dir, "algorithm.estimator=gae", "run.iterations=2", "critic.lr=1e-3"), resume=True,
                    loader=tiny_loader)  # fmt: skip
    critic = run.updater.critics["m"][0]
    for k, v in critic.state_dict().items():
        torch.testing.assert_close(v, saved[k])
    assert run.updater.critics["m"][1].optimizer.state_dict()["state"]  # AdamW moments restored


@pytest.mark.slow
def test_the_critic_learns_on_cpu(tmp_path):
    """A critic-PPO run on the tiny env: 10 critic-only iterations (the policy waits, so the returns' distribution
    is fixed), then 10 of PPO. During the warm-up the critic's error on each fresh batch falls and its explained
    variance rises; afterwards the policy improves."""
    run_dir = tmp_path / "learn"
    cfg = tiny_config(run_dir, "algorithm.estimator=gae", "run.iterations=20", "critic.warmup_iterations=10",
                      "critic.lr=3e-3", "rollout.batch_size=4")  # fmt: skip
    train(cfg, loader=tiny_loader)
    rows = read_metrics(run_dir / "metrics.jsonl")

    def mean(key, rs):
        return float(np.mean([np.mean([r[f"critic/{a}/{key}"] for a in "ab"]) for r in rs]))

    warm = rows[:10]
    assert mean("value_mse", warm[-3:]) < 0.7 * mean("value_mse", warm[:3])
    assert mean("explained_variance", warm[-3:]) > mean("explained_variance", warm[:3]) + 0.2
    scores = [r["rollout/score_mean"] for r in rows]
    assert np.mean(scores[-3:]) > np.mean(scores[:10]) + 0.03


def test_explained_variance_is_undefined_for_constant_returns():
    """1 - Var(R - V) / Var(R) needs Var(R) > 0: returns equal up to float residue give NaN, not -1e32."""
    from drmas_train.collect.samples import Sample
    from drmas_train.run.trainer import _value_metrics

    s = [Sample("u", f"t{i}", "a", "m", 0, 0, [1], [2, 3], [0.0, 0.0], [1, 1]) for i in range(2)]
    residue = [np.array([0.3, 0.3]), np.array([0.3, 0.3 + 1e-17])]
    out = _value_metrics(s, [np.array([0.1, 0.2]), np.array([0.0, 0.5])], residue)
    assert np.isnan(out["critic/a/explained_variance"]) and out["critic/a/value_mse"] > 0
    spread = _value_metrics(s, [np.array([0.1, 0.2]), np.array([0.0, 0.5])], [np.array([0.0, 1.0]), np.array([0.5, 0.5])])
    r, v = np.array([0.0, 1.0, 0.5, 0.5]), np.array([0.1, 0.2, 0.0, 0.5])
    assert spread["critic/a/explained_variance"] == pytest.approx(1 - np.var(r - v) / np.var(r))
