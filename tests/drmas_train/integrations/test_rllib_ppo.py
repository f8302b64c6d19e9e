"""Real RLlib (new API stack): multi-agent PPO on math-solver-verifier-v0 through ParallelPettingZooEnv.

The recipe is :mod:`drmas_train.integrations.rllib_ppo`: ``to_parallel(..., acting_only=True)`` so RLlib logs one
agent step per env step (only the acting agent), and the ``TokenObservations`` connector.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium import spaces

from drmas_train.integrations.numeric_env import token_feature_space as token_observation_space
from drmas_train.integrations.numeric_env import token_features as encode_tokens

QWEN_PAD = 151643


def test_token_observation_space_and_encoding_golden():
    space = spaces.Dict(
        {
            "input_ids": spaces.Box(0, 9, (3,), dtype=np.int64),  # V = 10
            "attention_mask": spaces.Box(0, 1, (3,), dtype=np.int8),
            "action_mask": spaces.Box(0, 1, (2,), dtype=np.int8),
        }
    )
    out = token_observation_space(space)
    assert out == spaces.Box(0.0, 1.0, (8,), dtype=np.float32)
    obs = {
        "input_ids": np.array([9, 3, 9]),  # the last 9 is padding
        "attention_mask": np.array([1, 1, 0], dtype=np.int8),
        "action_mask": np.array([1, 0], dtype=np.int8),
    }
    vec = encode_tokens(obs, space)
    np.testing.assert_allclose(vec, [1.0, 1 / 3, 0.0, 1, 1, 0, 1, 0], rtol=1e-6)
    assert vec.dtype == np.float32 and vec in out
    text_space = spaces.Discrete(3)
    assert token_observation_space(text_space) is text_space
    bad = spaces.Dict({**space.spaces, "turn": spaces.Box(0, 50, (1,), dtype=np.int64)})
    with pytest.raises(ValueError, match=r"observation key 'turn' .* does not flatten into \[0, 1\]"):
        token_observation_space(bad)


def test_make_rllib_env_names_missing_config_keys():
    from drmas_train.integrations.rllib_ppo import make_rllib_env

    with pytest.raises(KeyError, match=r"env_config lacks \['tokenizer_file', 'pad_id'\]; accepted keys: env_id"):
        make_rllib_env({"env_id": "math-solver-verifier-v0"})


@pytest.mark.slow  # starts Ray and builds PPO: ~40 s on 2 busy cores
def test_rllib_multi_agent_ppo_trains_only_on_acting_agents_steps(qwen_tokenizer, tmp_path):
    pytest.importorskip("ray.rllib")
    torch = pytest.importorskip("torch")
    import ray

    from drmas_train.integrations.rllib_ppo import ppo_config

    qwen_tokenizer.save(str(tmp_path / "tokenizer.json"))
    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = ppo_config(
                "math-solver-verifier-v0",
                tokenizer_file=str(tmp_path / "tokenizer.json"),
                pad_id=QWEN_PAD,
                env_kwargs={"size": 8},
                train_batch_size=64,
                minibatch_size=32,
                hidden=(16,),
            )
            algo = config.build_algo()
        try:
            module = algo.get_module("solver")
            before = {k: v.detach().clone() for k, v in module.state_dict().items()}
            for _ in range(2):
                result = algo.train()
            learners = result["learners"]
            assert {"solver", "verifier"} <= set(learners)
            for agent in ("solver", "verifier"):
                assert np.isfinite(float(learners[agent]["total_loss"]))
            after = algo.get_module("solver").state_dict()
            assert any(not torch.equal(before[k], after[k]) for k in before)  # PPO updated the solver

            # What reaches the learner: the env runner's episodes. One agent step per env step, i.e. the acting
            # agent's only; a no-op of the waiting agent would add a second agent step to that env step.
            episodes = algo.env_runner.sample(num_timesteps=40, random_actions=False)
            # Whole episodes only (a sample may continue an episode that an earlier sample started).
            done = [ep for ep in episodes if ep.is_done and ep.env_t_started == 0]
            assert len(done) >= 5
            for ep in done:
                steps = {aid: len(sa) for aid, sa in ep.agent_episodes.items()}
                assert sum(steps.values()) == ep.env_t, steps
                assert steps["solver"] >= 1 and steps["verifier"] <= steps["solver"]
                # Each agent's RLlib return is its drmas return R - sum of its calls' format penalties, read
                # from the env's infos (each observation after a call carries that call's "penalty").
                for sa in ep.agent_episodes.values():
                    infos = sa.get_infos()
                    penalties = sum(info["penalty"] for info in infos[1:])
                    expected = infos[-1]["score"] - penalties
                    assert float(np.sum(sa.get_rewards())) == pytest.approx(expected, abs=1e-6)
                assert all(i["penalty"] == 0.0 for i in ep.agent_episodes["verifier"].get_infos()[1:])
        finally:
            algo.stop()
    finally:
        ray.shutdown()


@pytest.mark.parametrize(
    ("view", "agent_steps_per_env_step"), [("parallel", 2), ("parallel-acting-only", 1), ("aec", 1)]
)
def test_rllib_episode_logs_one_agent_step_per_env_step_only_for_the_acting_agent(
    tiny_tokenizer, view, agent_steps_per_env_step
):
    """RLlib's own episode bookkeeping (``MultiAgentEpisode``) on each drmas view, as its env runner feeds it.

    The default Parallel view observes both agents every step, so RLlib computes and logs an action for the
    waiting agent too (a no-op trained as a decision); ``to_parallel(acting_only=True)`` under
    ``ParallelPettingZooEnv``, and the AEC env under RLlib's ``PettingZooEnv``, log exactly the acting agent's step.
    """
    pytest.importorskip("ray.rllib")
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
    from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv, PettingZooEnv

    from drmas_envs.wrappers import VERIFIER_CHOICES, DiscreteChoices, TokenSpaces, to_parallel
    from helpers.toy_envs import VerifyLoopEnv

    aec = TokenSpaces(
        DiscreteChoices(VerifyLoopEnv(max_loops=3), {"verifier": VERIFIER_CHOICES}), tiny_tokenizer, 8, 2, pad_id=0
    )
    if view == "aec":
        env = PettingZooEnv(aec)
    else:
        env = ParallelPettingZooEnv(to_parallel(aec, acting_only=view == "parallel-acting-only"))
    for space in env.action_space.values():
        space.seed(0)
    env_steps = agent_steps = 0
    for episode_index in range(5):
        episode = MultiAgentEpisode(observation_space=env.observation_space, action_space=env.action_space)
        obs, infos = env.reset(seed=episode_index)
        episode.add_env_reset(observations=obs, infos=infos)
        while not episode.is_done:
            actions = {agent: env.action_space[agent].sample() for agent in obs}  # RLlib acts for observed agents
            obs, rewards, terms, truncs, infos = env.step(actions)
            episode.add_env_step(obs, actions, rewards, infos=infos, terminateds=terms, truncateds=truncs)
        env_steps += episode.env_t
        agent_steps += sum(len(sa) for sa in episode.agent_episodes.values())
    assert env_steps >= 10
    assert agent_steps == agent_steps_per_env_step * env_steps
