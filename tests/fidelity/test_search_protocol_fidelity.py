"""search-orchestrator-v0 against the Dr. MAS reference (``langfengQ/DrMAS``): routing, observations, validity.

Cited files (paths in the reference repository):
  orchestra  = agent_system/agent/orchestra/search/search_orchestra.py
  verifier   = agent_system/agent/agents/search/verifier_agent.py
  search     = agent_system/agent/agents/search/search_agent.py
  answer     = agent_system/agent/agents/search/answer_agent.py
  projection = agent_system/agent/utils.py (general_projection)
  env        = agent_system/environments/env_package/search/third_party/skyrl_gym/envs/search/env.py
  tool       = agent_system/environments/env_package/search/third_party/skyrl_gym/tools/search.py
  memory     = agent_system/memory/memory.py
  manager    = agent_system/environments/env_manager.py
  prompts    = agent_system/environments/prompts/search.py
"""

import json

import pytest

import drmas_envs
from drmas_envs.core import ListTaskSource, Task
from drmas_envs.search.corpus import Passage
from drmas_envs.search.prompts import ORCHESTRATOR_PROMPTS
from fidelity.reference_mirror import reference_file, triple_quoted

ENV_ID = "search-orchestrator-v0"
CORPUS = [
    Passage("p0", "Zorvik", "Zorvik is a moon of the planet Quell. Its capital is Amberlo."),
    Passage("p1", "Amberlo", "Amberlo was founded in 1823 by the poet Ilsa Varn."),
]
QUESTION = "Who founded the capital of Zorvik?"
TASK = Task("t0", "tiny", QUESTION, ("Ilsa Varn",))
THINK = "<think>Let me reason.</think>"


def make_env(**kwargs):
    return drmas_envs.make(ENV_ID, tasks=ListTaskSource([TASK]), corpus=CORPUS, **kwargs)


def play(env, actions):
    acted = []
    for action in actions:
        acted.append(env.agent_selection)
        env.step(action)
    return acted


def over(env):
    return all(env.terminations[a] or env.truncations[a] for a in env.agents)


# ---- 1. routing -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "valid"),
    [
        ("The information looks fine.", False),  # no <verify> pair: invalid (projection :172-176)
        ("<verify>maybe</verify>", True),  # a pair with another word: valid (projection :178-187)
        ("<verify>yes, no</verify>", True),  # neither exact verdict
    ],
)
def test_verdict_less_verifier_routes_to_the_answer_agent(reply, valid):
    """verifier:72-79 (neither yes nor no -> True = sufficient) and orchestra:146-148,170 (True -> Answer Agent)."""
    env = make_env()
    env.reset(seed=0)
    env.step(reply)
    assert env.agent_selection == "answer"
    info = env.infos["verifier"]
    assert (info["verdict"], info["routed"], info["is_action_valid"]) == (None, "yes", valid)
    env.step(THINK + "<answer>Ilsa Varn</answer>")
    assert all(env.terminations.values()) and env.infos["answer"]["em"] == 1.0
    assert env.episode_returns == pytest.approx({"verifier": 1.0 - (0 if valid else 0.01), "search": 1.0, "answer": 1.0})


def test_yes_wins_over_no_and_case_is_ignored_in_the_verdict():
    """verifier:74-77: ``<verify>yes</verify>`` is tested first, on the lower-cased projected reply."""
    env = make_env()
    env.reset(seed=0)
    env.step("<verify>no</verify> on second thought <verify>YES</verify>")
    assert env.agent_selection == "answer" and env.infos["verifier"]["verdict"] == "yes"
    env.reset(seed=0)
    env.step("<VERIFY>no</VERIFY>")  # invalid (the tags are exact, projection :169-176) but still a "no"
    assert env.agent_selection == "search" and env.infos["verifier"]["is_action_valid"] is False


def test_no_at_the_last_step_ends_the_episode_without_an_answer():
    """orchestra:151 (Search only when ``step < max_steps``) and orchestra:170 (Answer only on yes): after a "no"
    at the last step nobody else acts; the env gets an empty action and ends at the step limit, env.py:59-60,
    with reward compute_score(no <answer>) = 0 (search/utils.py:89-92)."""
    env = make_env(max_steps=2)
    env.reset(seed=0)
    acted = play(env, ["<verify>no</verify>", THINK + "<search>capital of Zorvik</search>", "<verify>no</verify>"])
    assert acted == ["verifier", "search", "verifier"]
    assert over(env) and all(env.truncations.values()) and not any(env.terminations.values())
    final = env.infos["verifier"]
    assert (final["ended_by"], final["steps"], final["em"], final["num_searches"]) == ("step_limit", 2, 0.0, 1)
    assert env.episode_returns == {"verifier": 0.0, "search": 0.0, "answer": 0.0}  # no call was invalid


def test_answer_without_answer_tag_does_not_end_the_episode():
    """env.py:58-61: done only with ``<answer>`` and ``</answer>`` in the action (or at the step limit). The
    tag-less reply projects to "" (answer:53, projection :172-176), so no search runs (tool:184-185, env.py:111-112),
    the step is stored with an empty action (memory:177-178) and the Verifier acts again at the next step."""
    env = make_env(max_steps=3)
    env.reset(seed=0)
    acted = play(env, ["<verify>yes</verify>", THINK + "It was Ilsa Varn."])
    assert acted == ["verifier", "answer"] and not over(env)
    assert env.agent_selection == "verifier" and env.infos["answer"]["is_action_valid"] is False
    prompt = env.observe("verifier")["messages"][1]["content"]
    assert "already taken 1 step(s)" in prompt and "History:\nStep 1: \n\n" in prompt
    assert "You are now at step 2." in prompt
    play(env, ["<verify>yes</verify>", THINK + "<answer>Ilsa Varn</answer>"])
    assert all(env.terminations.values()) and env.infos["answer"]["ended_by"] == "answer"
    assert env.episode_returns == pytest.approx({"verifier": 1.0, "search": 1.0, "answer": 0.99})


def test_tag_less_answer_at_the_last_step_ends_at_the_step_limit():
    """env.py:59-60: at ``turns >= max_turns`` the episode is done whatever the action; no answer -> reward 0."""
    env = make_env(max_steps=1)
    env.reset(seed=0)
    play(env, ["<verify>yes</verify>", THINK + "Ilsa Varn"])
    assert all(env.truncations.values()) and env.infos["answer"]["ended_by"] == "step_limit"
    assert env.episode_returns == pytest.approx({"verifier": 0.0, "search": 0.0, "answer": -0.01})


def test_an_answer_pair_inside_a_search_reply_ends_the_episode():
    """search_agent.py:55 projects the Search reply to ``<search>q</search>`` (projection :178-185, return_tag=True); the env
    ends the episode when that action holds ``<answer>`` and ``</answer>`` (env.py:58-61, checked at :84-86 before
    any search, so nothing is retrieved), and scores the last answer pair of the history (env.py:49-53,
    search/utils.py:65-98): EM 1 -> reward 1 for every agent."""
    env = make_env(max_steps=4)
    env.reset(seed=0)
    reply = THINK + "<search>Who founded Amberlo? <answer>Ilsa Varn</answer></search>"
    acted = play(env, ["<verify>no</verify>", reply])
    assert acted == ["verifier", "search"] and all(env.terminations.values())
    final = env.infos["search"]
    assert (final["ended_by"], final["prediction"], final["em"], final["num_searches"]) == ("search_answer", "Ilsa Varn", 1.0, 0)
    assert env.episode_returns == pytest.approx({"verifier": 1.0, "search": 1.0, "answer": 1.0})
    # the same reply under the drmas v0 rule is a search for the whole query text
    env = make_env(max_steps=4, termination="answer_agent")
    env.reset(seed=0)
    play(env, ["<verify>no</verify>", reply])
    assert env.agent_selection == "verifier" and env.infos["search"]["query"] == "Who founded Amberlo? <answer>Ilsa Varn</answer>"


def test_an_answer_pair_outside_the_search_tags_is_dropped_by_the_projection():
    """projection :178-185: only ``<search>...</search>`` reaches the env, so an answer pair after it is no action;
    a wrong answer inside the query ends the episode with reward 0."""
    env = make_env(max_steps=4)
    env.reset(seed=0)
    play(env, ["<verify>no</verify>", THINK + "<search>capital of Zorvik</search><answer>Ilsa Varn</answer>"])
    assert env.agent_selection == "verifier" and env.infos["search"]["query"] == "capital of Zorvik"
    play(env, ["<verify>no</verify>", THINK + "<search><answer>Quell</answer></search>"])
    assert all(env.terminations.values()) and env.infos["verifier"]["em"] == 0.0
    assert env.infos["verifier"]["ended_by"] == "search_answer" and env.infos["verifier"]["num_searches"] == 1


def test_the_prediction_is_the_last_answer_pair_of_the_whole_history():
    """env.py:49-53: compute_score runs on the concatenated chat history; a query that left ``<answer>`` open pairs
    with the Answer agent's ``</answer>`` (search/utils.py:67-76, non-greedy, leftmost first)."""
    env = make_env(max_steps=4)
    env.reset(seed=0)
    play(env, ["<verify>no</verify>", THINK + "<search>Zorvik <answer> capital</search>", "<verify>yes</verify>",
               THINK + "<answer>Ilsa Varn</answer>"])  # fmt: skip
    prediction = env.infos["answer"]["prediction"]
    assert prediction.startswith("capital</search>") and prediction.endswith("<answer>Ilsa Varn")
    assert env.infos["answer"]["em"] == 0.0
    env = make_env(max_steps=4, termination="answer_agent")  # drmas v0: the Answer reply's own pair
    env.reset(seed=0)
    play(env, ["<verify>no</verify>", THINK + "<search>Zorvik <answer> capital</search>", "<verify>yes</verify>",
               THINK + "<answer>Ilsa Varn</answer>"])  # fmt: skip
    assert env.infos["answer"]["prediction"] == "Ilsa Varn" and env.infos["answer"]["em"] == 1.0


class _Down:
    """A retriever whose server is down (what HTTPRetriever raises once its retries are spent)."""

    name = "down"

    def search(self, queries, topk):
        from drmas_envs.search.retrievers import RetrieverUnavailableError

        raise RetrieverUnavailableError("server at http://127.0.0.1:1/retrieve is unavailable: ...",
                                        reason="ConnectError: [Errno 111] Connection refused (10 attempt(s) in 45.0 s)")


def test_a_failed_retrieval_becomes_the_observation():
    """tools/search.py:211-216: a failed call's result text is ``{"result": "Search error: <error>"}``, wrapped in
    ``<information>`` by env.py:74 and stored in the memory (manager:46-49); the run goes on."""
    env = drmas_envs.make(ENV_ID, tasks=ListTaskSource([TASK]), retriever=_Down())
    env.reset(seed=0)
    play(env, ["<verify>no</verify>", THINK + "<search>capital of Zorvik</search>"])
    error = "ConnectError: [Errno 111] Connection refused (10 attempt(s) in 45.0 s)"
    assert env.infos["search"]["retrieval_error"] == error and env.infos["search"]["retrieved_ids"] == []
    prompt = env.observe("verifier")["messages"][1]["content"]
    assert "Step 1:<search>capital of Zorvik</search> <information>" + json.dumps({"result": "Search error: " + error}) in prompt
    from drmas_envs.search.retrievers import RetrieverUnavailableError

    env = drmas_envs.make(ENV_ID, tasks=ListTaskSource([TASK]), retriever=_Down(), retrieval_failure="raise")
    env.reset(seed=0)
    env.step("<verify>no</verify>")
    with pytest.raises(RetrieverUnavailableError, match="is unavailable"):
        env.step(THINK + "<search>capital of Zorvik</search>")


# ---- 2. what each agent sees ------------------------------------------------------------------------------


def test_search_agent_sees_the_verifiers_output_of_the_same_step():
    """orchestra:142 appends ``\\nThe output of "Verifier Agent": <reply>\\n`` to the team context, which fills
    search:29-30 ("Your Teammates' Outputs at Step {step}"); the reply is the verifier's whole reply with the
    verdict stripped in place (verifier:60, projection :179-180). System message: multi_turn_rollout/utils.py:107,
    120-123 with the search data's system turn (examples/data_preprocess/drmas_search.py:17)."""
    env = make_env()
    env.reset(seed=0)
    env.step("Nothing retrieved yet. <verify> no </verify>")
    system, user = env.observe("search")["messages"]
    assert system == {"role": "system", "content": "You are a helpful and harmless assistant."}
    assert user["role"] == "user"
    text = user["content"]
    expected_order = [
        "\n# Task Introduction\n\nYou are a member of an expert multi-agent team",
        f"The question is: {QUESTION}\n",
        "\n\n# Your Teammates' Outputs at Step 1\n",
        '\nThe output of "Verifier Agent": Nothing retrieved yet. <verify>no</verify>\n',
        '\n\n# Your Role\nYou are a "Search Agent".',
        "This reasoning process MUST be enclosed within <think> </think> tags.",
    ]
    positions = [text.index(piece) for piece in expected_order]
    assert positions == sorted(positions) and text.startswith(expected_order[0])


def test_verifier_and_answer_agent_see_no_teammate_output():
    """verifier:25-41 and answer:25-34 have no ``{team_context}`` slot: the role text follows the task prompt."""
    env = make_env()
    env.reset(seed=0)
    verifier = env.observe("verifier")["messages"][1]["content"]
    assert verifier.index("# Task Introduction") < verifier.index('# Your Role\nYou are a "Verifier Agent"')
    assert "You are now at step 1." in verifier and "The output of" not in verifier
    env.step("I think it is enough. <verify>yes</verify>")
    answer = env.observe("answer")["messages"][1]["content"]
    assert "The output of" not in answer and "I think it is enough" not in answer
    assert answer.index("# Task Introduction") < answer.index('# Your Role\nYou are an "Answer Agent"')


def test_history_lines_are_the_reference_memory_and_search_tool_text():
    """memory:177-182 (``Step i:{action} {information}\\n`` joined by newlines), manager:91-96 (step count),
    tool:132-137,231-232 (``Doc i: <contents>`` lines in ``json.dumps({"result": ...})``), env.py:74
    (``<information>...</information>``) and envs.py:90 (the observation is stripped)."""
    env = make_env(topk=1)
    env.reset(seed=0)
    play(env, ["<verify>no</verify>", THINK + "<search> capital of Zorvik </search>"])
    prompt = env.observe("verifier")["messages"][1]["content"]
    result = json.dumps({"result": 'Doc 1: "Zorvik"\nZorvik is a moon of the planet Quell. Its capital is Amberlo.\n'})
    line = f"Step 1:<search>capital of Zorvik</search> <information>{result}</information>\n"
    assert "Prior to this step, your team have already taken 1 step(s)." in prompt
    assert f"History:\n{line}\n" in prompt


@pytest.mark.parametrize(
    ("reply", "valid"),
    [
        (THINK + "<search>capital of Zorvik</search>", True),
        ("<search>capital of Zorvik</search>", False),  # no <think> block
        ("<think>a</think><think>b</think><search>capital of Zorvik</search>", False),  # two blocks
        ("</think>x<think><search>capital of Zorvik</search>", False),  # closing before opening
        (THINK + "<search>Zorvik 的首都</search>", False),  # CJK ideographs (projection :194-196)
    ],
)
def test_search_reply_needs_one_think_block_but_runs_anyway(reply, valid):
    """search:55 projects with check_think_tag=True (projection :198-208); an invalid reply's query still runs:
    validity only sets ``is_action_valid`` (the format penalty), the action is the ``<search>`` content."""
    env = make_env()
    env.reset(seed=0)
    play(env, ["<verify>no</verify>", reply])
    assert env.infos["search"]["is_action_valid"] is valid
    assert env.infos["search"]["retrieved_ids"]  # retrieval ran


def test_answer_without_think_is_scored_and_penalised():
    """answer:53 checks <think> (projection :198-208) but env.py:61 ends the episode on the <answer> pair alone."""
    env = make_env()
    env.reset(seed=0)
    play(env, ["<verify>yes</verify>", "<answer>Ilsa Varn</answer>"])
    assert all(env.terminations.values()) and env.infos["answer"]["em"] == 1.0
    assert env.episode_returns == pytest.approx({"verifier": 1.0, "search": 1.0, "answer": 0.99})


@pytest.mark.parametrize(
    ("key", "path", "name", "fields"),
    [
        ("verifier", "agent_system/agent/agents/search/verifier_agent.py", "PROMPT", {}),
        ("search", "agent_system/agent/agents/search/search_agent.py", "PROMPT", {}),
        ("answer", "agent_system/agent/agents/search/answer_agent.py", "PROMPT", {}),
        ("task", "agent_system/environments/prompts/search.py", "SEARCH_MULTIAGENT_TEMPLATE_NO_HIS",
         {"{question}": "{task_description}"}),
        ("task_with_history", "agent_system/environments/prompts/search.py", "SEARCH_MULTIAGENT_TEMPLATE",
         {"{question}": "{task_description}", "{memory}": "{memory_context}"}),
    ],
)
def test_templates_are_the_reference_text_verbatim(key, path, name, fields):
    """The role and task templates equal the reference's (only drmas's field names differ)."""
    ours = ORCHESTRATOR_PROMPTS[key]
    for mine, theirs in fields.items():
        ours = ours.replace(mine, theirs)
    assert ours == triple_quoted(reference_file(path), name)
