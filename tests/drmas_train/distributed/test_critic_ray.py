"""PPO's critic and the KL in the reward on the Ray path: a worker group of 2 training ranks (FSDP2 or DDP) holds the
model's critics (one for the model, or one per agent) beside the policy; values, the KL log-probs, the critics' update
and the per-token policy update match the single-process path, and the critics' sharded checkpoint restores them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from drmas_train.algorithm.sample_advantages import gae_returns
from drmas_train.backends.base import SamplingParams
from drmas_train.collect.rollout import rollout
from drmas_train.run.trainer import build_run, compute_advantages
from helpers.tiny_rl import tiny_config, tiny_loader

pytestmark = pytest.mark.slow  # Ray actors start in ~10-30 s on 2 cores (still run in CI)

OVERRIDES = ("algorithm.estimator=gae", "algorithm.reward_kl_coef=0.01", "critic.lr=1e-3")


@pytest.fixture(
    scope="module", params=[("fsdp2", "model"), ("ddp", "agent")], ids=["fsdp2-per-model", "ddp-per-agent"]
)
def runs(request, ray_cluster, tmp_path_factory):
    """(single-process run, Ray run with 2 ranks) of the same tiny config with critics and a reference: FSDP2 ranks
    holding one critic for the model's two agents, or DDP ranks holding one critic per agent."""
    strategy, per = request.param
    tmp = tmp_path_factory.mktemp(f"critic_runs_{strategy}")
    over = (*OVERRIDES, f"critic.per={per}")
    local = build_run(tiny_config(tmp / "local", *over), loader=tiny_loader)
    dist = build_run(tiny_config(tmp / "ray", *over, "distributed.enabled=true", "distributed.world_size.m=2",
                                 f"distributed.strategy={strategy}"), loader=tiny_loader)  # fmt: skip
    yield local, dist, per
    dist.updater.close()


def test_critic_on_the_ranks_matches_single_process(runs, tmp_path):
    local, dist, per = runs
    critics = ["m"] if per == "model" else ["a", "b"]
    assert dist.updater.critic_keys == {"a": critics[0], "b": critics[-1]}
    assert dist.updater.critic_groups == dict.fromkeys(critics, "m")
    tasks = [local.tasks[i] for i in range(2)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=4)
    samples = rollout(local.env_fn, tasks, 4, local.pool, sampling, seed=1, max_prompt_tokens=32).samples
    for it in range(2):
        values, got = local.updater.critic_values(samples), dist.updater.critic_values(samples)
        for a, b in zip(values, got, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5)
        for want, have in zip(
            local.updater.kl_logprobs(samples), dist.updater.kl_logprobs(samples), strict=True
        ):
            for a, b in zip(want, have, strict=True):
                np.testing.assert_allclose(a, b, atol=1e-5)
        returns = gae_returns(samples, values, local.cfg.algorithm)
        m_local = local.updater.update_critics(samples, values, returns, it)
        m_dist = dist.updater.update_critics(samples, values, returns, it)
        for cid in critics:
            for key in ("vf_loss", "vf_clipfrac", "grad_norm"):
                got, want = m_dist[f"critic/{cid}/{key}"], m_local[f"critic/{cid}/{key}"]
                assert got == pytest.approx(want, rel=1e-4, abs=1e-7), (cid, key)
        adv = compute_advantages(local.cfg, samples, values=values)  # (B, T) per token
        assert adv.ndim == 2
        p_local, p_dist = local.updater.update(samples, adv, it), dist.updater.update(samples, adv, it)
        assert p_dist["loss/m/grad_norm"] == pytest.approx(p_local["loss/m/grad_norm"], rel=1e-4)
    # sharded checkpoint: save, train the critic further, restore: the saved values come back
    dist.updater.write_state(tmp_path)
    assert all((tmp_path / "critics" / cid / "sharded" / "drmas_sharded.json").is_file() for cid in critics)
    saved = dist.updater.critic_values(samples)
    returns = gae_returns(samples, saved, local.cfg.algorithm)
    dist.updater.update_critics(samples, saved, returns, 7)
    moved = dist.updater.critic_values(samples)
    assert max(np.abs(a - b).max() for a, b in zip(saved, moved, strict=True)) > 1e-4
    dist.updater.read_state(Path(tmp_path))
    for a, b in zip(saved, dist.updater.critic_values(samples), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
