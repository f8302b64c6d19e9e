"""SingleAgentEnv: gymnasium.make("drmas/<id>"), check_env, returns, and a Gymnasium vector-env consumer."""

from __future__ import annotations

import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import drmas_envs
from drmas_envs.core import Turn
from drmas_envs.wrappers import (
    VERIFIER_CHOICES,
    DiscreteChoices,
    SingleAgentEnv,
    TokenSpaces,
    gymnasium_id,
    make_single_agent_env,
    register_gymnasium_envs,
)
from helpers.toy_envs import EchoEnv, VerifyLoopEnv


def _check_env_without_warnings(env):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped, skip_render_check=False)
    assert [str(w.message) for w in caught] == []


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        ("drmas/toy-echo-v0", {}),
        ("drmas/toy-verify-loop-v0", {}),
        ("drmas/toy-verify-loop-v0", {"agent_id": "verifier", "others": {"solver": lambda obs: "answer: 2"}}),
    ],
)
def test_gymnasium_make_and_check_env(toy_ids, env_id, kwargs, capsys):
    env = gymnasium.make(env_id, **kwargs)
    assert isinstance(env.unwrapped, SingleAgentEnv)
    assert env.unwrapped.agent_id == kwargs.get("agent_id", env.unwrapped.env.possible_agents[0])
    _check_env_without_warnings(env)
    capsys.readouterr()  # check_env renders the "human" mode to stdout


def test_register_is_idempotent_and_maps_ids(toy_ids):
    assert register_gymnasium_envs() == []
    assert gymnasium_id("toy-echo-v0") == "drmas/toy-echo-v0"
    assert gymnasium_id("mine/toy-echo-v0") == "mine/toy-echo-v0"
    assert gymnasium.spec("drmas/toy-echo-v0").kwargs == {"env_id": "toy-echo-v0"}


def test_verifier_view_returns_the_episode_reward():
    solver_calls = []

    def solver(obs):
        solver_calls.append(obs["prompt"])
        return "answer: 4" if len(solver_calls) == 1 else "answer: 2"

    env = SingleAgentEnv(VerifyLoopEnv(format_penalty=0.1, max_loops=3), "verifier", {"solver": solver})
    obs, info = env.reset(seed=0, options={"task_index": 1})  # 1 + 1 -> "2"
    assert "proposed: answer: 4" in obs["prompt"] and info["role"] == "verifier"
    obs, reward, terminated, truncated, info = env.step("<verify>reject</verify>")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert "proposed: answer: 2" in obs["prompt"]
    obs, reward, terminated, truncated, info = env.step("<verify>approve</verify>")
    assert (reward, terminated, truncated) == (1.0, True, False) and info["won"] is True
    with pytest.raises(RuntimeError, match=r"step\(\) called before reset\(\) or after the episode ended"):
        env.step("<verify>approve</verify>")


def test_solver_view_sums_penalty_and_episode_reward():
    env = SingleAgentEnv(
        VerifyLoopEnv(format_penalty=0.25), "solver", {"verifier": lambda obs: "<verify>approve</verify>"}
    )
    env.reset(seed=0, options={"task_index": 0})
    _, reward, terminated, _, _ = env.step("zero")  # invalid (-0.25), approved, wrong answer (R = 0)
    assert (reward, terminated) == (-0.25, True)
    env.reset(seed=0, options={"task_index": 0})
    _, reward, terminated, _, _ = env.step("answer: 0")
    assert (reward, terminated) == (1.0, True)


def test_reset_gives_up_when_the_agent_never_acts():
    class OneTurn(EchoEnv):
        """Ends after 'a' speaks, so 'b' never acts."""

        def _act(self, agent, text):
            return Turn(valid=True, next_agent=None)

    env = SingleAgentEnv(OneTurn(), "b", {"a": lambda obs: "ok"}, max_reset_attempts=3)
    with pytest.raises(RuntimeError, match=r"3 episodes in a row ended before agent 'b' could act"):
        env.reset(seed=0)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"unknown agent_id 'c'; the env's agents are \['a', 'b'\]"):
        SingleAgentEnv(EchoEnv(), "c")
    with pytest.raises(ValueError, match=r"no policy for agents \['b'\]: give others="):
        SingleAgentEnv(EchoEnv(), "a", {})
    with pytest.raises(ValueError, match=r"others has policies for \['z'\], which are not other agents"):
        SingleAgentEnv(EchoEnv(), "a", {"b": "random", "z": print})
    with pytest.raises(
        TypeError, match=r"policy for agent 'b' must be callable\(observation\) -> action, got 3"
    ):
        SingleAgentEnv(EchoEnv(), "a", {"b": 3})
    with pytest.raises(ValueError, match=r"others must be 'random' or a dict"):
        SingleAgentEnv(EchoEnv(), "a", "greedy")
    with pytest.raises(drmas_envs.RegistrationError, match=r"no env named 'nope' is registered"):
        make_single_agent_env("nope-v0")


def test_sync_vector_env_random_rollout_over_token_spaces(toy_ids, qwen_tokenizer):
    """A Gymnasium consumer: SyncVectorEnv (autoreset) over gymnasium.make('drmas/...'), 100 random steps."""
    wrap = [
        lambda e: DiscreteChoices(e, {"verifier": VERIFIER_CHOICES}),
        lambda e: TokenSpaces(e, qwen_tokenizer, 48, 6, pad_id=qwen_tokenizer.token_to_id("<|endoftext|>")),
    ]
    envs = gymnasium.vector.SyncVectorEnv(
        [
            lambda: gymnasium.make(
                "drmas/toy-verify-loop-v0", agent_id="solver", aec_wrappers=wrap, format_penalty=0.1
            )
            for _ in range(2)
        ],
        autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP,
    )
    envs.action_space.seed(0)
    obs, _ = envs.reset(seed=0)
    assert obs["input_ids"].shape == (2, 48) and obs["attention_mask"].dtype == np.int8
    total, episodes = np.zeros(2), 0
    for _ in range(100):
        obs, rewards, terms, truncs, _ = envs.step(envs.action_space.sample())
        assert obs["input_ids"].shape == (2, 48)
        total += rewards
        episodes += int(np.sum(terms | truncs))
    # Random tokens never contain "answer:": every solver call is invalid (-0.1) and no episode is won.
    assert episodes > 0
    np.testing.assert_allclose(total.sum(), -0.1 * 200)
    envs.close()


#: Registered built-in envs and the kwargs that keep them small; ids not registered in a checkout are skipped.
REAL_ENVS = {
    "math-solver-v0": {"size": 8},
    "math-solver-verifier-v0": {"size": 8, "agent_id": "verifier"},
    "math-generator-verifier-refiner-v0": {"size": 8},
    # the other agents' filler text has no verdict; the reference routes that to the Answer agent, so the Search
    # agent would never act: route it to the Search agent instead
    "search-orchestrator-v0": {"agent_id": "search", "missing_verdict": "no"},
    "search-r1-v0": {},
}


@pytest.mark.parametrize("env_id", sorted(REAL_ENVS))
def test_check_env_on_built_in_envs(env_id, capsys):
    if env_id not in drmas_envs.registry:
        pytest.skip(f"{env_id} is not registered in this checkout")
    register_gymnasium_envs()
    env = gymnasium.make(f"drmas/{env_id}", **REAL_ENVS[env_id])
    _check_env_without_warnings(env)
    capsys.readouterr()


def test_math_verifier_as_a_discrete_gymnasium_env():
    if "math-solver-verifier-v0" not in drmas_envs.registry:
        pytest.skip("math-solver-verifier-v0 is not registered in this checkout")
    text_env = drmas_envs.make("math-solver-verifier-v0", size=8)

    def solver(obs):  # a perfect solver: box the ground truth
        return f"The answer is \\boxed{{{text_env.unwrapped.task.answers[0]}}}."

    env = SingleAgentEnv(
        DiscreteChoices(text_env, {"verifier": VERIFIER_CHOICES}), "verifier", {"solver": solver}
    )
    assert env.action_space == gymnasium.spaces.Discrete(2)
    obs, _ = env.reset(seed=0, options={"task_index": 0})
    assert obs["action_mask"].tolist() == [1, 1]
    _, reward, terminated, _, info = env.step(0)  # approve the correct answer
    assert (reward, terminated, info["won"]) == (1.0, True, True)
    env.reset(seed=0, options={"task_index": 0})
    # reject: the solver answers again in the last loop, still right
    _, reward, terminated, _, info = env.step(1)
    assert (reward, terminated, info["won"]) == (1.0, True, True)
    assert [r.agent for r in text_env.unwrapped.history] == ["solver", "verifier", "solver"]


def test_importing_the_wrappers_registers_gymnasium_ids_without_torch():
    import subprocess
    import sys

    code = (
        "import sys, gymnasium, drmas_envs.wrappers; "
        "from drmas_envs.wrappers import gymnasium_id; "
        "ids = sorted(i for i in gymnasium.registry if i.startswith('drmas/') or i.startswith('openspiel/')); "
        "assert ids == sorted(gymnasium_id(i) for i in drmas_envs.registry), ids; "
        "assert 'openspiel/kuhn_poker-v0' in ids, ids; "
        "assert 'torch' not in sys.modules, 'drmas_envs.wrappers imported torch'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
