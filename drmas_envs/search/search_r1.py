"""# Search-R1 (``search-r1-v0``): one agent interleaving reasoning, search and answer

| Import             | `drmas_envs.make("search-r1-v0")`                                             |
|--------------------|-------------------------------------------------------------------------------|
| Agents             | `["searcher"]`                                                                |
| Actions            | free text (`str`)                                                             |
| Observations       | `{"prompt": str, "messages": ({"role", "content"}, ...)}`                    |
| Default data       | synthetic encyclopedia (seeded, offline) + in-process BM25, top-3             |

The protocol of Search-R1 (Jin et al., 2025, arXiv 2503.09516). The agent sees the instruction with the
question followed by its own transcript. Each call, the first complete `<search>`/`<answer>` pair decides:

* `<answer>a</answer>`: the episode terminates; reward = EM(a, golds).
* `<search>q</search>`: the top-k passages are appended as `<information>Doc 1(Title: t) ...</information>`
  after the call's text, and the agent is called again.
* neither (or an empty query): invalid; Search-R1's "My previous action is invalid..." note is appended.

At most `max_turns` calls (default 4). The last call may only answer (its searches are not run, as in Search-R1's
final rollout without search); without an answer there the episode is *truncated* with reward 0.

## Rewards

| Outcome                                  | reward                                    |
|------------------------------------------|-------------------------------------------|
| answer EM with a gold answer             | `1.0 - format_penalty x invalid calls`    |
| wrong, empty, or no answer in time       | `0.0 - format_penalty x invalid calls`    |

`format_penalty` defaults to 0.0 (Search-R1 has none). Final infos: `em`, `f1`, `subem`, `prediction`, `golds`,
`num_searches`, `turns`. Retrieved text is untrusted data (protocol tags escaped, never interpreted).

## Arguments

Same data arguments as `search-orchestrator-v0` (`tasks`, `corpus`, `retriever`, `retriever_kwargs`,
`synthetic`, `topk=3`), plus `max_turns=4`, `format_penalty=0.0`, `max_action_chars=20000`, `prompts`
(overrides of `SEARCH_R1_PROMPTS`), `render_mode`.

## Version History

* v0: initial release.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from drmas_envs.core import Outcome, TaskSource, TextAECEnv, Turn
from drmas_envs.core.factories import make_factories
from drmas_envs.search.base import SearchTextEnv, check_ints
from drmas_envs.search.orchestrator import MAX_QUERY_CHARS
from drmas_envs.search.parsing import first_tag
from drmas_envs.search.prompts import SEARCH_R1_PROMPTS
from drmas_envs.search.qa_metrics import qa_scores
from drmas_envs.search.retrievers import format_passages

__all__ = ["SearchR1Env", "raw_env", "env", "parallel_env"]


class SearchR1Env(SearchTextEnv):
    """Single-agent Search-R1 loop; see the module docstring (the env card)."""

    possible_agents = ["searcher"]
    metadata = {**TextAECEnv.metadata, "name": "search_r1_v0"}

    # ---- episode state, rebuilt by _start_episode ----
    transcript: list[str]  # the agent's outputs and the appended <information>/invalid notes, in order
    prediction: str  # the extracted answer ("" if none)
    num_searches: int

    default_prompts = SEARCH_R1_PROMPTS

    def __init__(
        self, tasks: TaskSource | str | Path | None = None, *, max_turns: int = 4, format_penalty: float = 0.0, **shared: Any
    ) -> None:
        """See the module docstring; ``shared``: the data arguments of :class:`~drmas_envs.search.base.SearchTextEnv`."""
        check_ints(max_turns=(max_turns, 1))
        super().__init__(tasks, format_penalty=format_penalty, **shared)
        self.max_turns = max_turns

    def _start_episode(self) -> str:
        self.transcript = []
        self.prediction = ""
        self.num_searches = 0
        return "searcher"

    def _prompt(self, agent: str) -> tuple[str, str]:
        return "", self.prompts["instruction"].format(question=self.task.question) + "".join(self.transcript)

    def _act(self, agent: str, text: str) -> Turn:
        turn_no = self.num_turns + 1  # calls made including this one
        kept = text[: self.max_action_chars]
        found = first_tag(text, ("search", "answer"), max_chars=self.max_action_chars)
        if found is not None and found[0] == "answer":
            self.prediction = found[1]
            self.transcript.append(kept)
            return Turn(True, None, info={"action": "answer", "prediction": self.prediction})
        valid = found is not None and bool(found[1])
        if turn_no >= self.max_turns:  # last call: no search is run, no answer -> truncated
            self.transcript.append(kept)
            return Turn(valid, None, truncated=True, info={"action": "out_of_turns"})
        if valid:
            query = found[1][:MAX_QUERY_CHARS]
            passages = self.retriever.search([query], self.topk)[0]
            self.num_searches += 1
            self.transcript.append(f"{kept}\n\n<information>{format_passages(passages)}</information>\n\n")
            return Turn(True, "searcher", info={"action": "search", "query": query, "retrieved_ids": [p.id for p in passages]})
        self.transcript.append(kept + self.prompts["invalid"])
        return Turn(False, "searcher", info={"action": "invalid"})

    def _episode_outcome(self) -> Outcome:
        scores = qa_scores(self.prediction, self.task.answers)
        return Outcome(scores["em"], scores["em"] == 1.0, {
            **scores, "prediction": self.prediction, "golds": list(self.task.answers),
            "num_searches": self.num_searches, "turns": self.num_turns,
        })


raw_env = SearchR1Env
env, parallel_env = make_factories(raw_env)
