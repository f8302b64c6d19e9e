"""# Search Orchestrator (``search-orchestrator-v0``): the Dr. MAS multi-agent search env

| Import             | `drmas_envs.make("search-orchestrator-v0")`                                  |
|--------------------|-------------------------------------------------------------------------------|
| Agents             | `["verifier", "search", "answer"]`                                            |
| Actions            | free text (`str`)                                                             |
| Observations       | `{"prompt": str, "messages": ({"role", "content"}, ...)}` per agent           |
| Default data       | synthetic encyclopedia (seeded, offline) + in-process BM25, top-3             |

Three LLM agents answer a question with a search engine (Dr. MAS, arXiv 2602.08847, search setting).
Each **env step** starts with the **Verifier** (router), which decides whether the information gathered so far
suffices: `<verify>yes</verify>` hands over to the **Answer agent**, whose `<answer>...</answer>` ends the episode;
`<verify>no</verify>` hands over to the **Search agent**, whose `<search>query</search>` is run against the
retriever; the top-k passages are appended to the shared memory and the next step begins.

**Step limit.** At most `max_steps` (default 4) env steps; searching is not allowed at the last step. There,
`<verify>no</verify>` (a well-formed verdict, not penalised) still routes to the Answer agent, which must answer
with what was gathered (`infos["verifier"]["forced_answer"] = True`). So an episode always ends with one Answer
call and has at most `2 * max_steps` calls. An invalid verdict (no/other tag) counts as `no` before the last
step and as `yes` at it, and is penalised.

**Observation.** Every agent sees its role's system prompt, the question, `Step i of max_steps` and the last
`history_length` (default 4) memory records (`[Step i] Query: q` then the passages in an `<information>` block,
Search-R1 style `Doc j(Title: t) text`). Retrieved text is untrusted data: protocol tags inside it are escaped
and it is never parsed or executed.

**Parsing** (:mod:`drmas_envs.search.parsing`, bounded cost on the first `max_action_chars` characters): tags are
case-insensitive, contents stripped, the first complete `<search>`/`<answer>` pair is used. Invalid calls:
Verifier without a yes/no verdict; Search without a non-empty query (nothing is retrieved, the memory records
the failure); Answer without an `<answer>` pair (scored as the empty answer).

## Rewards

| Outcome                                   | every agent                         |
|-------------------------------------------|-------------------------------------|
| final answer EM with a gold answer        | `1.0 - format_penalty x own invalid calls` |
| otherwise (incl. empty or `A or B or C`)  | `0.0 - format_penalty x own invalid calls` |

EM after SQuAD normalisation, max over gold answers (:mod:`drmas_envs.search.qa_metrics`); `em`, `f1`,
`subem`, `prediction`, `golds`, `num_searches`, `steps` are added to every agent's final infos. The episode
always *terminates* (never truncates). `format_penalty` defaults to 0.01.

## Arguments

`tasks` (None = synthetic, a QA file path, `"hf:<id>[:<config>][@<split>]"`, or a TaskSource), `corpus` (wiki-18 JSONL path or passages; HotpotQA
files default to their contexts), `retriever` (`"bm25"`, `"dense"`, `"http"` or an object with `search`),
`retriever_kwargs`, `synthetic` (EncyclopediaConfig fields), `topk=3`, `max_steps=4`, `history_length=4`,
`format_penalty=0.01`, `max_action_chars=20000`, `prompts` (overrides of `ORCHESTRATOR_PROMPTS`), `render_mode`.
A retriever failure (e.g. the HTTP server is down) raises `RetrieverUnavailableError`: it is infrastructure, not
agent behaviour.

## Version History

* v0: initial release.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from drmas_envs.core import Outcome, TaskSource, TextAECEnv, Turn
from drmas_envs.core.factories import make_factories
from drmas_envs.search.base import SearchTextEnv, check_ints
from drmas_envs.search.corpus import Passage
from drmas_envs.search.parsing import extract_tag, neutralize_tags, parse_verdict
from drmas_envs.search.prompts import ORCHESTRATOR_PROMPTS
from drmas_envs.search.qa_metrics import qa_scores
from drmas_envs.search.retrievers import format_passages

__all__ = ["SearchOrchestratorEnv", "SearchRecord", "raw_env", "env", "parallel_env"]

#: queries are cut to this many characters before retrieval
MAX_QUERY_CHARS = 512


@dataclasses.dataclass(frozen=True)
class SearchRecord:
    """One entry of the shared memory: the step, the query (None when the Search call was invalid), the passages."""

    step: int
    query: str | None
    passages: tuple[Passage, ...]

    def render(self) -> str:
        """``[Step i] Query: q`` and the passages in an ``<information>`` block."""
        if self.query is None:
            return f"[Step {self.step}] (the Search agent gave no valid <search> query; nothing was retrieved)"
        return (f"[Step {self.step}] Query: {neutralize_tags(self.query)}\n"
                f"<information>\n{format_passages(self.passages)}\n</information>")


class SearchOrchestratorEnv(SearchTextEnv):
    """Verifier -> (Search | Answer) loop over a retriever; see the module docstring (the env card)."""

    possible_agents = ["verifier", "search", "answer"]
    metadata = {**TextAECEnv.metadata, "name": "search_orchestrator_v0"}

    # ---- episode state, rebuilt by _start_episode ----
    step_index: int  # current env step, 1-based
    memory: list[SearchRecord]  # every search of this episode, in order
    prediction: str  # the Answer agent's extracted answer ("" when invalid)
    forced_answer: bool  # the Verifier said no (or nothing) at the last step

    default_prompts = ORCHESTRATOR_PROMPTS

    def __init__(
        self,
        tasks: TaskSource | str | Path | None = None,
        *,
        max_steps: int = 4,
        history_length: int = 4,
        format_penalty: float = 0.01,
        **shared: Any,
    ) -> None:
        """See the module docstring; ``shared``: the data arguments of :class:`~drmas_envs.search.base.SearchTextEnv`."""
        check_ints(max_steps=(max_steps, 1), history_length=(history_length, 0))
        super().__init__(tasks, format_penalty=format_penalty, **shared)
        self.max_steps, self.history_length = max_steps, history_length

    # ---- hooks ----
    def _start_episode(self) -> str:
        self.step_index = 1
        self.memory = []
        self.prediction = ""
        self.forced_answer = False
        return "verifier"

    def _memory_text(self) -> str:
        records = self.memory[-self.history_length :] if self.history_length else []
        if not records:
            return self.prompts["empty_memory"]
        return "Information gathered so far (most recent last):\n" + "\n\n".join(r.render() for r in records)

    def _prompt(self, agent: str) -> tuple[str, str]:
        last = self.step_index >= self.max_steps
        user = self.prompts["user"].format(
            question=self.task.question,
            step=self.step_index,
            max_steps=self.max_steps,
            note=self.prompts["last_step_note"] if last and agent == "verifier" else "",
            memory=self._memory_text(),
        )
        return self.prompts[agent], user

    def _act(self, agent: str, text: str) -> Turn:
        if agent == "verifier":
            verdict = parse_verdict(text, max_chars=self.max_action_chars)
            last = self.step_index >= self.max_steps
            go_answer = verdict == "yes" or last
            self.forced_answer = last and verdict != "yes"
            return Turn(verdict is not None, "answer" if go_answer else "search",
                        info={"verdict": verdict, "forced_answer": self.forced_answer, "step": self.step_index})
        if agent == "search":
            query = extract_tag(text, "search", max_chars=self.max_action_chars)
            valid = bool(query)
            record = SearchRecord(self.step_index, None, ())
            if valid:
                query = query[:MAX_QUERY_CHARS]
                record = SearchRecord(self.step_index, query, tuple(self.retriever.search([query], self.topk)[0]))
            self.memory.append(record)
            self.step_index += 1
            return Turn(valid, "verifier", info={"query": record.query, "retrieved_ids": [p.id for p in record.passages]})
        answer = extract_tag(text, "answer", max_chars=self.max_action_chars)
        self.prediction = answer or ""
        return Turn(answer is not None, None, info={"prediction": self.prediction})

    def _episode_outcome(self) -> Outcome:
        scores = qa_scores(self.prediction, self.task.answers)
        return Outcome(scores["em"], scores["em"] == 1.0, {
            **scores,
            "prediction": self.prediction,
            "golds": list(self.task.answers),
            "num_searches": sum(r.query is not None for r in self.memory),
            "steps": self.step_index,
            "forced_answer": self.forced_answer,
        })


raw_env = SearchOrchestratorEnv
env, parallel_env = make_factories(raw_env)
