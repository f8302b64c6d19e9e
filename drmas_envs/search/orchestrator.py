"""# Search Orchestrator (``search-orchestrator-v0``): the Dr. MAS multi-agent search env

| Import             | `drmas_envs.make("search-orchestrator-v0")`                                  |
|--------------------|-------------------------------------------------------------------------------|
| Agents             | `["verifier", "search", "answer"]` (roles "Verifier Agent", "Search Agent", "Answer Agent") |
| Actions            | free text (`str`)                                                             |
| Observations       | `{"prompt": str, "messages": ({"role": "system"}, {"role": "user"})}` per agent (plus `worked_examples` turns) |
| Default data       | synthetic encyclopedia (seeded, offline) + in-process BM25, top-3             |

Three LLM agents answer a question with a search engine (Dr. MAS, arXiv 2602.08847, search setting). The
protocol, prompts and validity rules are those of the authors' code (`langfengQ/DrMAS`,
`agent_system/agent/orchestra/search/search_orchestra.py`, cited below as `orchestra:<line>`); every
difference is a named option whose default is the reference behaviour (see `docs/fidelity.md`).

**One env step** (at most `max_steps`, default 4; `step` counts from 1):

1. The **Verifier** (router) reads the question and the history. `<verify>yes</verify>` routes to the Answer
   agent, `<verify>no</verify>` to the Search agent (`orchestra:146-148`). A reply with neither verdict routes
   like `missing_verdict` (default `"yes"`: the Answer agent, `verifier_agent.py:78-79`).
2. **"no" before the last step**: the **Search agent** writes `<search>query</search>`; the top-`topk` passages
   are retrieved and the step is stored in the shared memory; the next step begins (`orchestra:151`). The
   env acts on the projected reply `<search>query</search>`; if that holds an `<answer>...</answer>` pair (inside
   the query), the episode **ends there** and is scored like an answer, nothing is retrieved (`env.py:58-61`:
   an answer pair in *any* action ends the episode, and the reference checks it before searching;
   `termination="answer_agent"`, the drmas v0 rule, treats it as a search).
3. **"no" at the last step**: nobody else acts (`orchestra:151`, `step < max_steps`); the step limit ends the
   episode without an answer: reward 0, *truncated* (the reference's `env.py:59-60`). Option
   `last_step_no="answer"` instead routes to the Answer agent (drmas v0 behaviour, a "forced answer").
4. **"yes"**: the **Answer agent** replies. With an `<answer>...</answer>` pair the episode terminates and is
   scored (`env.py:61`). The prediction is the last `<answer>` pair of the episode's whole history, as the
   reference scores its concatenated chat history (`env.py:49-53`, `utils.py:65-76`; the same as the reply's
   own pair unless an earlier search query left an `<answer>` open). Without one (`answer_without_tag="continue"`, the reference) the step is stored with an
   empty action and the next step begins (`env.py:97-112`), or at the last step the step limit ends the episode
   (reward 0, truncated). `answer_without_tag="end"` ends the episode with the empty answer (drmas v0 behaviour).

So an episode has at most `2 * max_steps` calls.

**Observation** (`agents/base.py:50-66`, `multi_turn_rollout/utils.py:107-123`): a system message
(`"You are a helpful and harmless assistant."`) and one user message: the role template around the environment
prompt (the question; from step 2 on also the number of steps taken and the last `history_length` steps, each
`Step i:<search>q</search> <information>...</information>`, `memory/memory.py:167-182`). The **Search agent**
also sees its teammates' outputs of the same step: the Verifier's reply (with its verdict stripped in place),
as `The output of "Verifier Agent": ...` (`orchestra:142`, `search_agent.py:29-30`). The Verifier and the Answer
agent see no teammate output (their templates have no such slot). Retrieval results are rendered as the
reference's search tool does: `<information>{"result": "Doc 1: <contents>\\nDoc 2: ..."}</information>` (JSON,
`tools/search.py:132-137,231-232`); `information_format="search_r1"` renders `Doc 1(Title: t) text` lines instead.
Retrieved text is untrusted data: protocol tags inside it are escaped (a deliberate difference; identical for
passages without such tags).

**Validity** (`is_action_valid`, :mod:`drmas_envs.core.projection`, `agent/utils.py:155-211`): tags are matched
exactly (lower-case, first opening and first closing tag). Verifier: a `<verify>`/`</verify>` pair (any content).
Search / Answer: a `<search>` / `<answer>` pair **and** exactly one `<think>...</think>` block
(`require_think=True`). Every agent: no CJK ideograph (`reject_cjk=True`). An invalid reply still acts: a Search
reply without `<think>` is still run, an Answer reply without `<think>` is still scored; only the penalty differs.

## Rewards

| Outcome                                   | every agent                         |
|-------------------------------------------|-------------------------------------|
| final answer EM with a gold answer        | `1.0 - format_penalty x own invalid calls` |
| otherwise (wrong, empty, none in time)    | `0.0 - format_penalty x own invalid calls` |

EM after SQuAD normalisation, max over gold answers (:mod:`drmas_envs.search.qa_metrics`, the reference's
`em_check`); `em`, `f1`, `subem`, `prediction`, `golds`, `num_searches`, `steps`, `forced_answer`,
`ended_by` (`"answer"`, `"search_answer"`, `"step_limit"` or `"no_answer_tag"`) are added to every agent's final
infos.
`format_penalty` defaults to 0.01 (`examples/drmas_trainer/run_search.sh`, `invalid_action_penalty_coef`).

## Arguments

`tasks` (None = synthetic, a QA file path, `"hf:<id>[:<config>][@<split>]"`, or a TaskSource), `corpus`
(wiki-18 JSONL path or passages; HotpotQA files default to their contexts), `retriever` (`"bm25"`, `"dense"`,
`"http"` or an object with `search`), `retriever_kwargs`, `synthetic` (EncyclopediaConfig fields), `topk=3`,
`max_steps=4`, `history_length=4`, `format_penalty=0.01`, `max_action_chars=20000` (replies are cut to this
before parsing), `prompts` (overrides of `ORCHESTRATOR_PROMPTS` keys), and the fidelity options
`missing_verdict="yes"`, `last_step_no="end"`, `answer_without_tag="continue"`, `require_think=True`,
`reject_cjk=True`, `information_format="reference"`, `termination="reference"`,
`retrieval_failure="observation"`; `worked_examples=None` (a drmas addition, no reference counterpart:
`{agent: [{"user": str, "assistant": str}, ...]}`, shown to that agent as earlier chat turns between the system
message and its real user message, so a small model can imitate the tag format; the protocol and rewards are
unchanged); `render_mode`. The drmas v0 rules are `missing_verdict="no",
last_step_no="answer", answer_without_tag="end", require_think=False, termination="answer_agent",
retrieval_failure="raise"`.

**Retrieval failures** (the server unreachable or failing past the retriever's retries,
`RetrieverUnavailableError`): as the reference's search tool, the failure becomes the step's observation,
`<information>{"result": "Search error: <what failed>"}</information>` (`tools/search.py:211-216`), with a warning
in the log and `retrieval_error` in the Search agent's step infos. `retrieval_failure="raise"` stops the run
instead. A misconfigured retriever (`RetrieverError`: a server that rejects the request, a wrong protocol)
always raises.

## Version History

* v0: initial release; the defaults follow the Dr. MAS reference since drmas issue 16 (the earlier rules are
  options).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from drmas_envs.core import Outcome, TaskSource, TextAECEnv, Turn
from drmas_envs.core.factories import make_factories
from drmas_envs.core.projection import project_action
from drmas_envs.search.base import SearchTextEnv, check_ints
from drmas_envs.search.corpus import Passage
from drmas_envs.search.parsing import has_answer_pair, last_answer, neutralize_tags, reference_verdict
from drmas_envs.search.prompts import ORCHESTRATOR_PROMPT_FIELDS, ORCHESTRATOR_PROMPTS
from drmas_envs.search.qa_metrics import qa_scores
from drmas_envs.search.retrievers import RetrieverUnavailableError, format_passages

__all__ = [
    "SearchOrchestratorEnv", "SearchRecord", "check_worked_examples", "format_information", "format_search_error",
    "raw_env", "env", "parallel_env",
]

log = logging.getLogger(__name__)

#: queries are cut to this many characters before retrieval
MAX_QUERY_CHARS = 512

#: Display role names (the reference's agent ids, ``search_orchestra.py:68-70``), by drmas agent id.
ROLE_NAMES = {"verifier": "Verifier Agent", "search": "Search Agent", "answer": "Answer Agent"}

#: Accepted values of the fidelity options (first = the reference's default).
OPTION_CHOICES: dict[str, tuple[str, ...]] = {
    "missing_verdict": ("yes", "no"),
    "last_step_no": ("end", "answer"),
    "answer_without_tag": ("continue", "end"),
    "information_format": ("reference", "search_r1"),
    "termination": ("reference", "answer_agent"),
    "retrieval_failure": ("observation", "raise"),
}


def format_information(passages: Sequence[Passage], style: str = "reference") -> str:
    """The retrieval result of one query as an agent sees it in the history.

    ``"reference"``: the Dr. MAS search tool's text, ``<information>`` + ``json.dumps({"result": ...})`` +
    ``</information>`` with ``Doc i: <contents>`` lines (``langfengQ/DrMAS
    agent_system/environments/env_package/search/third_party/skyrl_gym/tools/search.py:132-137,231-239`` and
    ``envs/search/env.py:74``). A query with no passage gives ``{"result": ""}``, as there: the reference server
    answers one (empty) list per query, so the tool's "No search results found." (``:238-239``, an empty outer
    list) is never reached and its join of zero documents is empty.
    ``"search_r1"``: ``Doc i(Title: t) text`` lines (:func:`drmas_envs.search.retrievers.format_passages`).
    Passage text is untrusted: protocol tags in it are escaped (:func:`drmas_envs.search.parsing.neutralize_tags`).

    Raises:
        ValueError: unknown ``style``.
    """
    if style == "search_r1":
        return f"<information>\n{format_passages(passages)}\n</information>"
    if style != "reference":
        raise ValueError(f"information_format must be one of {OPTION_CHOICES['information_format']}, got {style!r}")
    result = "".join(f"Doc {i}: {neutralize_tags(p.contents.strip())}\n" for i, p in enumerate(passages, 1))
    return "<information>" + json.dumps({"result": result}) + "</information>"


def format_search_error(reason: str, style: str = "reference") -> str:
    """A failed retrieval as an agent sees it: the reference's search tool turns the failure into its result
    text, ``{"result": "Search error: <error>"}`` (``.../skyrl_gym/tools/search.py:211-216``; its error text names a
    random request id and the ``requests`` exception, drmas's names the httpx exception and the attempts).

    Raises:
        ValueError: unknown ``style``.
    """
    if style == "search_r1":
        return f"<information>\nSearch error: {neutralize_tags(reason)}\n</information>"
    if style != "reference":
        raise ValueError(f"information_format must be one of {OPTION_CHOICES['information_format']}, got {style!r}")
    return "<information>" + json.dumps({"result": f"Search error: {neutralize_tags(reason)}"}) + "</information>"


@dataclasses.dataclass(frozen=True)
class SearchRecord:
    """One past env step in the shared memory.

    Attributes:
        step: the env step (1-based).
        action: the step's projected action as the reference stores it (``<search>q</search>``, or ``""`` when the
            step produced no search: an invalid Search reply or a tag-less Answer reply).
        query: the query that was run, or ``None`` when nothing was retrieved.
        passages: the retrieved passages.
        information: the rendered retrieval result (:func:`format_information`), ``""`` when nothing was run.
    """

    step: int
    action: str
    query: str | None
    passages: tuple[Passage, ...]
    information: str

    def render(self, template: str) -> str:
        """This step as one history line, ``template`` filled with ``step``, ``action`` and ``information``."""
        return template.format(step=self.step, action=self.action, information=self.information)


def _check_prompts(prompts: Mapping[str, str]) -> None:
    for key, template in prompts.items():
        if not isinstance(template, str):
            raise ValueError(f"prompt {key!r} must be a str template, got {type(template).__name__}")
        allowed = ORCHESTRATOR_PROMPT_FIELDS[key]
        fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
        bad = sorted(fields - allowed)
        if bad:
            raise ValueError(f"prompt {key!r} uses unknown field(s) {bad}; allowed: {sorted(allowed)}")


def check_worked_examples(
    examples: Mapping[str, Sequence[Mapping[str, str]]] | None, agents: Sequence[str]
) -> dict[str, tuple[tuple[str, str], ...]]:
    """``agent -> ((user, assistant), ...)`` from the env option ``worked_examples``
    (``{agent: [{"user": str, "assistant": str}, ...]}``; None = no examples, the reference).

    Raises:
        ValueError: an unknown agent, an example that is not a mapping with exactly the str keys ``user`` and
            ``assistant``, or an empty text.
    """
    if examples is None:
        return {}
    if not isinstance(examples, Mapping):
        raise ValueError(
            f"worked_examples must map agent ids to lists of {{user, assistant}}, got {type(examples).__name__}"
        )
    out: dict[str, tuple[tuple[str, str], ...]] = {}
    for agent, items in examples.items():
        if agent not in agents:
            raise ValueError(f"worked_examples: unknown agent {agent!r}; agents: {list(agents)}")
        if isinstance(items, (str, Mapping)) or not isinstance(items, Sequence):
            raise ValueError(
                f"worked_examples[{agent!r}] must be a list of {{user, assistant}}, got {type(items).__name__}"
            )
        pairs = []
        for i, item in enumerate(items):
            if not isinstance(item, Mapping) or set(item) != {"user", "assistant"}:
                keys = sorted(item) if isinstance(item, Mapping) else type(item).__name__
                raise ValueError(
                    f"worked_examples[{agent!r}][{i}] must have exactly the keys 'user' and 'assistant', got {keys}"
                )
            if not all(isinstance(item[k], str) and item[k] for k in ("user", "assistant")):
                raise ValueError(
                    f"worked_examples[{agent!r}][{i}]: 'user' and 'assistant' must be non-empty str"
                )
            pairs.append((item["user"], item["assistant"]))
        out[agent] = tuple(pairs)
    return out


class SearchOrchestratorEnv(SearchTextEnv):
    """Verifier -> (Search | Answer) loop over a retriever; see the module docstring (the env card).

    Raises:
        ValueError: a bad int argument, an unknown fidelity option value, an unknown prompt key or field, plus
            the data and retriever errors of :class:`~drmas_envs.search.base.SearchTextEnv`.
    """

    possible_agents = ["verifier", "search", "answer"]
    metadata = {**TextAECEnv.metadata, "name": "search_orchestrator_v0"}

    # ---- episode state, rebuilt by _start_episode ----
    step_index: int  # current env step, 1-based
    memory: list[SearchRecord]  # every completed env step of this episode, in order
    prediction: str  # the Answer agent's extracted answer ("" when none)
    forced_answer: bool  # last_step_no="answer" sent a "no" at the last step to the Answer agent
    ended_by: str  # "answer", "search_answer", "step_limit" or "no_answer_tag" once the episode is over
    team_context: str  # teammates' outputs of the current env step (the reference's team_context)
    transcript: str  # the episode's actions and observations, concatenated (the reference's chat_history)

    default_prompts = ORCHESTRATOR_PROMPTS

    def __init__(
        self,
        tasks: TaskSource | str | Path | None = None,
        *,
        max_steps: int = 4,
        history_length: int = 4,
        format_penalty: float = 0.01,
        missing_verdict: str = "yes",
        last_step_no: str = "end",
        answer_without_tag: str = "continue",
        require_think: bool = True,
        reject_cjk: bool = True,
        information_format: str = "reference",
        termination: str = "reference",
        retrieval_failure: str = "observation",
        worked_examples: Mapping[str, Sequence[Mapping[str, str]]] | None = None,
        **shared: Any,
    ) -> None:
        """See the module docstring; ``shared``: the data arguments of :class:`~drmas_envs.search.base.SearchTextEnv`."""
        check_ints(max_steps=(max_steps, 1), history_length=(history_length, 0))
        for name, value in (("missing_verdict", missing_verdict), ("last_step_no", last_step_no),
                            ("answer_without_tag", answer_without_tag), ("information_format", information_format),
                            ("termination", termination), ("retrieval_failure", retrieval_failure)):
            if value not in OPTION_CHOICES[name]:
                raise ValueError(f"{name} must be one of {OPTION_CHOICES[name]}, got {value!r}")
        for name, value in (("require_think", require_think), ("reject_cjk", reject_cjk)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be a bool, got {value!r}")
        examples = check_worked_examples(worked_examples, self.possible_agents)
        super().__init__(tasks, format_penalty=format_penalty, **shared)
        _check_prompts(self.prompts)
        self.worked_examples = examples
        self.max_steps, self.history_length = max_steps, history_length
        self.missing_verdict, self.last_step_no, self.answer_without_tag = missing_verdict, last_step_no, answer_without_tag
        self.require_think, self.reject_cjk, self.information_format = require_think, reject_cjk, information_format
        self.termination, self.retrieval_failure = termination, retrieval_failure

    def observe(self, agent: str) -> dict[str, Any]:
        """The chat context ``agent`` sees now (:meth:`TextAECEnv.observe`), with its ``worked_examples`` (if any)
        as earlier (user, assistant) turns between the system message and the real user message; the flat
        ``prompt`` holds them in the same order, joined by blank lines."""
        obs = super().observe(agent)
        shots = self.worked_examples.get(agent, ())
        if not shots:
            return obs
        *head, user = obs["messages"]
        turns: list[dict[str, str]] = []
        for user_text, reply in shots:
            turns += [{"role": "user", "content": user_text}, {"role": "assistant", "content": reply}]
        prompt = "\n\n".join(
            [*(m["content"] for m in head), *(text for pair in shots for text in pair), user["content"]]
        )
        return {"prompt": prompt, "messages": (*head, *turns, user)}

    def role(self, agent: str) -> str:
        """Display role name (``"Search Agent"``) of an agent id."""
        return ROLE_NAMES.get(agent, agent)

    # ---- hooks ----
    def _start_episode(self) -> str:
        self.step_index = 1
        self.memory = []
        self.prediction = ""
        self.forced_answer = False
        self.ended_by = ""
        self.team_context = ""
        self.transcript = ""
        return "verifier"

    def env_prompt(self) -> str:
        """The environment prompt of the current step (the reference's ``build_text_obs``, ``env_manager.py:66-105``):
        the question, and from step 2 on the steps taken and the last ``history_length`` of them."""
        if not self.memory or self.history_length == 0:
            return self.prompts["task"].format(question=self.task.question)
        records = self.memory[-self.history_length :]
        memory = "\n".join(r.render(self.prompts["memory_step"]) for r in records)
        return self.prompts["task_with_history"].format(
            question=self.task.question, step_count=len(self.memory), memory=memory
        )

    def _prompt(self, agent: str) -> tuple[str, str]:
        user = self.prompts[agent].format(env_prompt=self.env_prompt(), team_context=self.team_context,
                                          step=self.step_index)
        return self.prompts["system"], user

    def _share(self, agent: str, text: str) -> None:
        """Append ``agent``'s output to this step's team context (``search_orchestra.py:28-36``)."""
        self.team_context += self.prompts["team_output"].format(role=self.role(agent), text=text)

    def _next_step(self, record: SearchRecord) -> None:
        # the reference's chat history: the step's action, then its observation (env.py:81,123-124,74)
        self.transcript += record.action + (f"\n{record.information}\n" if record.information else "")
        self.memory.append(record)
        self.step_index += 1
        self.team_context = ""

    def _act(self, agent: str, text: str) -> Turn:
        text = text[: self.max_action_chars]
        last = self.step_index >= self.max_steps
        if agent == "verifier":
            projection = project_action(text, "verify", keep_whole=True, reject_cjk=self.reject_cjk)
            verdict = reference_verdict(projection.action)
            decided = verdict or self.missing_verdict
            self._share(agent, projection.action)
            info = {"verdict": verdict, "routed": decided, "forced_answer": False, "step": self.step_index}
            if decided == "yes":
                return Turn(projection.valid, "answer", info=info)
            if not last:
                return Turn(projection.valid, "search", info=info)
            if self.last_step_no == "answer":
                self.forced_answer = True
                return Turn(projection.valid, "answer", info={**info, "forced_answer": True})
            self.ended_by = "step_limit"
            return Turn(projection.valid, None, truncated=True, info=info)
        if agent == "search":
            projection = project_action(text, "search", check_think=self.require_think, reject_cjk=self.reject_cjk)
            if self.termination == "reference" and has_answer_pair(projection.action):
                # the reference's env ends the episode on an answer pair in any action, before searching
                # (env.py:58-61,84-95), and scores the last answer pair of the whole history (env.py:49-53)
                self.prediction = last_answer(self.transcript + projection.action) or ""
                self.ended_by = "search_answer"
                return Turn(projection.valid, None, info={"query": None, "retrieved_ids": [],
                                                          "prediction": self.prediction, "step": self.step_index})
            query = None if projection.content is None else projection.content[:MAX_QUERY_CHARS]
            passages: tuple[Passage, ...] = ()
            information = ""
            info: dict[str, Any] = {"query": query, "retrieved_ids": [], "step": self.step_index}
            if query:  # an empty query retrieves nothing (a retriever's answer to "" is arbitrary)
                try:
                    passages = tuple(self.retriever.search([query], self.topk)[0])
                    information = format_information(passages, self.information_format)
                except RetrieverUnavailableError as err:
                    if self.retrieval_failure == "raise":
                        raise
                    log.warning("search-orchestrator-v0: retrieval failed, the agents see the error: %s", err)
                    information = format_search_error(err.reason, self.information_format)
                    info["retrieval_error"] = err.reason
            info["retrieved_ids"] = [p.id for p in passages]
            self._next_step(SearchRecord(self.step_index, projection.action, query or None, passages, information))
            return Turn(projection.valid, "verifier", info=info)
        projection = project_action(text, "answer", check_think=self.require_think, reject_cjk=self.reject_cjk)
        info = {"prediction": projection.content or "", "step": self.step_index}
        if projection.content is not None:
            if self.termination == "reference":  # the last answer pair of the whole history (env.py:49-53)
                self.prediction = last_answer(self.transcript + projection.action) or ""
            else:
                self.prediction = projection.content
            info["prediction"] = self.prediction
            self.ended_by = "answer"
            return Turn(projection.valid, None, info=info)
        if self.answer_without_tag == "end":
            self.ended_by = "no_answer_tag"
            return Turn(False, None, info=info)
        if last:
            self.ended_by = "step_limit"
            return Turn(False, None, truncated=True, info=info)
        self._next_step(SearchRecord(self.step_index, "", None, (), ""))
        return Turn(False, "verifier", info=info)

    def _episode_outcome(self) -> Outcome:
        scores = qa_scores(self.prediction, self.task.answers)
        return Outcome(scores["em"], scores["em"] == 1.0, {
            **scores,
            "prediction": self.prediction,
            "golds": list(self.task.answers),
            "num_searches": sum(r.query is not None for r in self.memory),
            "steps": self.step_index,
            "forced_answer": self.forced_answer,
            "ended_by": self.ended_by,
        })


raw_env = SearchOrchestratorEnv
env, parallel_env = make_factories(raw_env)
