"""math-solver-verifier-v0 against the Dr. MAS reference (``langfengQ/DrMAS``): what each math agent sees, and how
the Verifier's verdict is read.

Cited files (paths in the reference repository):
  orchestra = agent_system/agent/orchestra/math/math_orchestra.py
  solver    = agent_system/agent/agents/math/solver_agent.py
  verifier  = agent_system/agent/agents/math/verifier_agent.py
  prompts   = agent_system/environments/prompts/math.py
  rollout   = agent_system/multi_turn_rollout/utils.py
"""

import pytest

import drmas_envs
from drmas_envs.core import ListTaskSource, Task
from drmas_envs.math import prompts as P
from fidelity.reference_mirror import reference_file, triple_quoted

SV = "math-solver-verifier-v0"
TASKS = ListTaskSource([Task("t0", "unit", "What is 3 + 4?", "7")])
LONG_SOLUTION = "Step. " * 2000 + r"So the answer is \boxed{8}."  # 12,027 characters: the old 4,000 cap cut it
REVIEW = "Step 1 adds wrongly: 3 + 4 = 7. <verify> reject </verify>"


def test_solver_sees_every_teammate_output_in_full_and_in_order():
    """orchestra:28-36,95,113: each output is appended as ``\\nThe output of "<Agent>": <text>\\n``, oldest first,
    with no cap; the solver's text is its whole reply (solver:56, math_projection returns it unchanged) and the
    verifier's the whole reply with the verdict stripped in place (verifier:59-65, agent/utils.py:179-180).
    solver:26-37 puts the team context between the task and the role; rollout:107,120-123 adds the system turn."""
    env = drmas_envs.make(SV, data=TASKS)
    env.reset(options={"task_index": 0})
    env.step(LONG_SOLUTION)
    env.step(REVIEW)
    assert env.agent_selection == "solver"
    system, user = env.observe("solver")["messages"]
    assert system == {"role": "system", "content": "You are a helpful and harmless assistant."}
    expected_context = (
        f'\nThe output of "Solver Agent": {LONG_SOLUTION}\n'
        '\nThe output of "Verifier Agent": Step 1 adds wrongly: 3 + 4 = 7. <verify>reject</verify>\n'
    )
    task = ("You are a member of an expert multi-agent team tasked with solving the math problem.\n"
            "The team's math problem is: What is 3 + 4?\n")
    assert user["content"].startswith(f"\n# Task Introduction\n{task}\n\n# Your Teammates' Outputs\n{expected_context}\n"
                                      '\n# Your Role\nYou are a "Solver Agent".')


def test_first_solver_sees_an_empty_team_context():
    """orchestra/base.py:147 starts every team context as ``""``."""
    env = drmas_envs.make(SV, data=TASKS)
    env.reset(options={"task_index": 0})
    user = env.observe("solver")["messages"][1]["content"]
    assert "# Your Teammates' Outputs\n\n\n# Your Role\n" in user


def test_quote_cap_is_an_option_off_by_default():
    """The reference never cuts a teammate output (orchestra:35); drmas's ``max_quote_chars`` does, when set."""
    capped = drmas_envs.make(SV, data=TASKS, max_quote_chars=100)
    capped.reset(options={"task_index": 0})
    capped.step(LONG_SOLUTION)
    prompt = capped.observe("verifier")["prompt"]
    assert LONG_SOLUTION not in prompt and "characters omitted" in prompt and r"\boxed{8}" in prompt


@pytest.mark.parametrize(
    ("reply", "calls", "valid"),
    [
        ("Looks right. <verify> approve </verify>", 2, True),  # content stripped (utils.py:178-180) -> approve
        ("<verify>reject</verify> no wait <verify>approve</verify>", 2, True),  # approve is tested first (:77-78)
        ("<verify>maybe</verify>", 2, True),  # tags present: valid (utils.py:178-187); no verdict: approve (:81-82)
        ("<VERIFY>reject</VERIFY>", 2, False),  # exact tags only (utils.py:169-176): invalid, no verdict -> approve
        ("Step 2 is wrong. <verify>reject</verify>", 3, True),
        ("错了 <verify>reject</verify>", 3, False),  # CJK: invalid (utils.py:194-196), the verdict still counts
    ],
)
def test_math_verdict_is_read_as_the_reference(reply, calls, valid):
    """verifier:59-66 (projection with the whole reply kept), verifier:70-88 (the approve/reject vector)."""
    env = drmas_envs.make(SV, data=TASKS)
    env.reset(options={"task_index": 0})
    env.step(r"\boxed{7}")
    env.step(reply)
    assert env.infos["verifier"]["is_action_valid"] is valid
    if calls == 3:
        env.step(r"\boxed{7}")
    assert [r.agent for r in env.unwrapped.history] == ["solver", "verifier", "solver"][:calls]
    assert all(env.terminations.values())


def test_verdict_less_math_verifier_approves():
    """verifier:81-82: a reply with neither verdict counts as approve (the episode ends with the last solution)."""
    env = drmas_envs.make(SV, data=TASKS)
    env.reset(options={"task_index": 0})
    env.step(r"\boxed{7}")
    env.step("Looks fine to me.")
    assert all(env.terminations.values()) and env.infos["solver"]["won"] is True


@pytest.mark.parametrize(
    ("ours", "path", "name", "fields"),
    [
        (P.SOLVER_PROMPT, "agent_system/agent/agents/math/solver_agent.py", "SOLVER_PROMPT", {}),
        (P.VERIFIER_PROMPT, "agent_system/agent/agents/math/verifier_agent.py", "VERIFIER_PROMPT",
         {"{reviewed}": "Solver Agent"}),
        (P.ENV_PROMPT, "agent_system/environments/prompts/math.py", "MATH_MULTIAGENT_TEMPLATE",
         {"{question}": "{task_description}"}),
    ],
)
def test_math_templates_are_the_reference_text_verbatim(ours, path, name, fields):
    for mine, theirs in fields.items():
        ours = ours.replace(mine, theirs)
    assert ours == triple_quoted(reference_file(path), name)
