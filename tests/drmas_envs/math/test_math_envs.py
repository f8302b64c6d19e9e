"""Math env protocols with scripted policies: turn order, verdicts, last-answer grading, golden returns."""

from __future__ import annotations

import re

import pytest

import drmas_envs
from drmas_envs.core import ListTaskSource, Task
from drmas_envs.math.team import parse_verdict

TASKS = ListTaskSource([Task("t0", "unit", "What is 3 + 4?", "7"), Task("t1", "unit", "What is 1/2?", "0.5")])


def play(env_id, actions, *, task_index=0, **kwargs):
    """Run scripted ``actions`` in order (dead steps included).

    Returns (final infos per agent, [(agent, info) per call], whole-episode returns per agent).
    """
    env = drmas_envs.make(env_id, data=TASKS, **kwargs)
    env.reset(options={"task_index": task_index})
    calls, finals = [], {}
    script = iter(actions)
    for agent in env.agent_iter():
        _, _, terminated, truncated, info = env.last()
        if terminated or truncated:
            finals[agent] = info
            env.step(None)
            continue
        env.step(next(script))
        calls.append((agent, dict(env.infos[agent])))
    assert next(script, None) is None, "the episode ended before the script"
    assert env.agents == []
    return finals, calls, dict(env.unwrapped.episode_returns)


SV = "math-solver-verifier-v0"
APPROVE, REJECT = "All good. <verify>approve</verify>", "Step 2 is wrong. <verify>reject</verify>"

SV_CASES = [
    # (actions, kwargs, expected agents in order, expected score, expected returns)
    ([r"\boxed{7}", APPROVE], {}, ["solver", "verifier"], 1.0, {"solver": 1.0, "verifier": 1.0}),
    (
        [r"\boxed{3}", REJECT, r"\boxed{7}"],
        {},
        ["solver", "verifier", "solver"],
        1.0,
        {"solver": 1.0, "verifier": 1.0},
    ),
    # only the LAST solver answer is graded, even if an earlier one was right
    (
        [r"\boxed{7}", REJECT, r"\boxed{3}"],
        {},
        ["solver", "verifier", "solver"],
        0.0,
        {"solver": 0.0, "verifier": 0.0},
    ),
    # a wrong answer approved: reward 0 for both
    ([r"\boxed{8}", APPROVE], {}, ["solver", "verifier"], 0.0, {"solver": 0.0, "verifier": 0.0}),
    # no box + no verdict: missing verdict = approve (ends), both calls invalid
    (["seven", "looks fine"], {}, ["solver", "verifier"], 0.0, {"solver": -0.1, "verifier": -0.1}),
    # missing verdict configured as reject: the solver goes around again
    (
        [r"\boxed{3}", "hmm", r"\boxed{7}"],
        {"missing_verdict": "reject"},
        ["solver", "verifier", "solver"],
        1.0,
        {"solver": 1.0, "verifier": 0.9},
    ),
    # three loops, one invalid solver call, custom penalty 0.25
    (
        [r"\boxed{3}", REJECT, "no box", REJECT, r"\boxed{7}"],
        {"max_loops": 3, "format_penalty": 0.25},
        ["solver", "verifier", "solver", "verifier", "solver"],
        1.0,
        {"solver": 0.75, "verifier": 1.0},
    ),
    # max_loops=1: the solver alone; an empty box scores 0 and is valid under the reference's rule
    # (agent/utils.py:236-238: extract_answer gives "" not None), invalid under math_verify's
    ([r"\boxed{}"], {"max_loops": 1}, ["solver"], 0.0, {"solver": 0.0, "verifier": 0.0}),
    ([r"\boxed{}"], {"max_loops": 1, "grader": "math_verify"}, ["solver"], 0.0, {"solver": -0.1, "verifier": 0.0}),
    # \fbox and a brace-less \boxed: read by math_verify only (reference: no answer, invalid; utils.py:393-435)
    ([r"\fbox{7}", APPROVE], {}, ["solver", "verifier"], 0.0, {"solver": -0.1, "verifier": 0.0}),
    ([r"\fbox{7}", APPROVE], {"grader": "math_verify"}, ["solver", "verifier"], 1.0, {"solver": 1.0, "verifier": 1.0}),
    ([r"so \boxed 7", APPROVE], {}, ["solver", "verifier"], 0.0, {"solver": -0.1, "verifier": 0.0}),
    ([r"so \boxed 7", APPROVE], {"grader": "math_verify"}, ["solver", "verifier"], 1.0, {"solver": 1.0, "verifier": 1.0}),
    # </think>: the reference grades the text after it; a box only in the thinking is valid but scores 0
    ([r"<think>\boxed{7}</think> it is 7", APPROVE], {}, ["solver", "verifier"], 0.0, {"solver": 0.0, "verifier": 0.0}),
    ([r"<think>\boxed{7}</think> it is 7", APPROVE], {"grader": "math_verify"}, ["solver", "verifier"], 1.0,
     {"solver": 1.0, "verifier": 1.0}),
]


@pytest.mark.parametrize(("actions", "kwargs", "order", "score", "returns"), SV_CASES)
def test_solver_verifier_protocol(actions, kwargs, order, score, returns):
    finals, calls, got = play(SV, actions, **kwargs)
    assert [agent for agent, _ in calls] == order
    assert finals["solver"]["score"] == score
    assert got == pytest.approx(returns)
    # per-call score convention: episode reward minus that call's penalty
    penalty = kwargs.get("format_penalty", 0.1)
    assert [info["penalty"] for _, info in calls] == [
        0.0 if info["is_action_valid"] else penalty for _, info in calls
    ]


def test_solver_verifier_infos():
    # "<VERIFY> Reject </verify>" is a reject only under the lenient rule (the reference needs exact tags)
    finals, calls, _ = play(SV, [r"x \boxed{\frac{14}{2}}", "<VERIFY> Reject </verify>", r"\boxed{7}"],
                            verdict_rule="lenient")
    assert calls[0][1]["extracted"] == r"\frac{14}{2}" and calls[0][1]["loop"] == 1
    assert (calls[1][1]["verdict"], calls[1][1]["verdict_found"], calls[1][1]["role"]) == (
        "reject",
        True,
        "Verifier Agent",
    )
    final = finals["verifier"]
    assert (
        final["won"],
        final["grade_reason"],
        final["loops"],
        final["verdicts"],
        final["ground_truth"],
    ) == (True, "correct", 2, ["reject"], "7")


def test_team_context_and_quote_limit():
    # the team context is the reference's (full outputs, `The output of "<role>":` blocks; tests/fidelity), and
    # max_quote_chars is an option that cuts each quoted output
    env = drmas_envs.make(SV, data=TASKS, max_quote_chars=40)
    env.reset(options={"task_index": 0})
    first = env.observe("solver")["messages"][-1]["content"]
    assert "What is 3 + 4?" in first and "# Your Teammates' Outputs\n\n\n# Your Role" in first  # empty context
    long_solution = "A" * 100 + r" \boxed{7}"
    env.step(long_solution)
    seen = env.observe("verifier")
    assert seen["messages"] == ({"role": "system", "content": "You are a helpful and harmless assistant."},
                                {"role": "user", "content": seen["messages"][1]["content"]})
    quoted = "A" * 10 + "\n[... 70 characters omitted ...]\n" + "A" * 20 + r" \boxed{7}"
    assert '\nThe output of "Solver Agent": ' + quoted + "\n" in seen["prompt"]
    env.step(REJECT)
    again = env.observe("solver")["prompt"]
    assert '\nThe output of "Verifier Agent": ' + REJECT + "\n" in again


def test_prompt_overrides():
    env = drmas_envs.make(SV, data=TASKS, prompts={"solver": "Solve: {question}", "env": "Q={question}"},
                          system_prompt=None)
    env.reset(options={"task_index": 1})
    assert env.observe("solver")["prompt"] == "Solve: What is 1/2?"
    assert env.observe("verifier")["prompt"].startswith("\n# Task Introduction\nQ=What is 1/2?")
    with pytest.raises(
        ValueError,
        match=re.escape(
            "unknown prompt key(s) ['critic']; this env's prompts are: ['env', 'solver', 'verifier']"
        ),
    ):
        drmas_envs.make(SV, data=TASKS, prompts={"critic": "x"})
    with pytest.raises(ValueError, match=re.escape("prompt 'solver' uses unknown field(s) ['answer']")):
        drmas_envs.make(SV, data=TASKS, prompts={"solver": "{answer}"})


def test_bad_arguments():
    with pytest.raises(
        ValueError, match=re.escape("missing_verdict must be one of ('approve', 'reject'), got 'maybe'")
    ):
        drmas_envs.make(SV, data=TASKS, missing_verdict="maybe")
    with pytest.raises(ValueError, match="max_quote_chars must be an int >= 1, got 0"):
        drmas_envs.make(SV, data=TASKS, max_quote_chars=0)
    with pytest.raises(ValueError, match=re.escape("verdict_rule must be one of ('reference', 'lenient'), got 'x'")):
        drmas_envs.make(SV, data=TASKS, verdict_rule="x")


GVR = "math-generator-verifier-refiner-v0"


@pytest.mark.parametrize(
    ("actions", "kwargs", "order", "score", "returns"),
    [
        (
            [r"\boxed{7}", APPROVE],
            {},
            ["generator", "verifier"],
            1.0,
            {"generator": 1.0, "verifier": 1.0, "refiner": 1.0},
        ),
        (
            [r"\boxed{3}", REJECT, r"\boxed{7}"],
            {},
            ["generator", "verifier", "refiner"],
            1.0,
            {"generator": 1.0, "verifier": 1.0, "refiner": 1.0},
        ),
        (
            [r"\boxed{7}", REJECT, "I give up"],
            {},
            ["generator", "verifier", "refiner"],
            0.0,
            {"generator": 0.0, "verifier": 0.0, "refiner": -0.1},
        ),
        (
            [
                r"\boxed{3}",
                REJECT,
                r"\boxed{5}",
                "no tag",
            ],
            {"max_loops": 3},
            ["generator", "verifier", "refiner", "verifier"],
            0.0,
            {"generator": 0.0, "verifier": -0.1, "refiner": 0.0},
        ),
    ],
)
def test_generator_verifier_refiner_protocol(actions, kwargs, order, score, returns):
    finals, calls, got = play(GVR, actions, **kwargs)
    assert [agent for agent, _ in calls] == order
    assert finals["generator"]["score"] == score
    assert got == pytest.approx(returns)


def test_refiner_sees_the_review():
    env = drmas_envs.make(GVR, data=TASKS)
    env.reset(options={"task_index": 0})
    env.step(r"\boxed{3}")
    assert '"Generator Agent"' in env.observe("verifier")["prompt"]
    env.step(REJECT)
    prompt = env.observe("refiner")["prompt"]
    assert (
        '\nThe output of "Generator Agent": \\boxed{3}\n' in prompt
        and '\nThe output of "Verifier Agent": ' + REJECT + "\n" in prompt
    )


@pytest.mark.parametrize(("answer", "score", "returns"), [(r"\boxed{0.5}", 1.0, 1.0), ("1/2", 0.0, -0.1)])
def test_solver_env(answer, score, returns):
    finals, calls, got = play("math-solver-v0", [answer], task_index=1)
    assert [a for a, _ in calls] == ["solver"]
    assert finals["solver"]["score"] == score and got == {"solver": pytest.approx(returns)}


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("<verify>approve</verify>", "approve"),
        ("<verify>reject</verify> then <verify> APPROVE </verify>", "approve"),
        ("<verify>maybe</verify>", None),
        ("approve", None),
    ],
)
def test_parse_verdict(text, verdict):
    assert parse_verdict(text) == verdict


def test_default_env_runs_offline_on_reasoning_gym():
    env = drmas_envs.make("math-solver-verifier-v0")
    env.reset(seed=0)
    assert len(env.unwrapped.tasks) == 1000
    assert env.unwrapped.task.data_source == "reasoning_gym/gsm_symbolic"
    env.step(rf"\boxed{{{env.unwrapped.task.answer}}}")
    env.step(APPROVE)
    assert env.unwrapped.infos["solver"]["won"] is True


def test_data_spec_file(tmp_path):
    path = tmp_path / "aime.jsonl"
    path.write_text('{"problem": "p", "answer": 33}\n', encoding="utf-8")
    env = drmas_envs.make("math-solver-v0", data=str(path))
    env.reset(seed=0)
    assert (env.unwrapped.task.data_source, env.unwrapped.task.answer) == ("aime", "33")


def test_bad_actions_through_make():
    env = drmas_envs.make(SV, data=TASKS)
    # OrderEnforcingWrapper's message (AssertionError); the raw env's RuntimeError under python -O
    with pytest.raises((AssertionError, RuntimeError), match=r"reset\(\)"):
        env.step(r"\boxed{7}")
    env.reset(options={"task_index": 0})
    with pytest.raises(
        TypeError, match=re.escape("action for agent 'solver' must be a str (the model's text), got dict")
    ):
        env.step({"text": "7"})


def test_verified_team_signature_lists_its_own_then_the_team_arguments():
    import inspect

    from drmas_envs.registration import UnknownKwargError

    params = list(inspect.signature(drmas_envs.spec("math-solver-verifier-v0").load()).parameters)
    assert params == ["data", "max_loops", "missing_verdict", "verdict_rule", "size", "data_seed", "format_penalty",
                      "max_quote_chars", "prompts", "system_prompt", "grader", "grade_timeout_s", "render_mode"]  # fmt: skip
    with pytest.raises(UnknownKwargError, match="unknown keyword argument 'max_loop'. Did you mean 'max_loops'"):
        drmas_envs.make("math-generator-verifier-refiner-v0", max_loop=3)
    env = drmas_envs.make("math-solver-verifier-v0", size=4, max_loops=3, format_penalty=0.2)
    assert (env.unwrapped.max_loops, env.unwrapped.format_penalty, len(env.unwrapped.tasks)) == (3, 0.2, 4)
