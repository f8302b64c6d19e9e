"""Small drmas envs for the wrapper tests: the echo env of :mod:`helpers.echo_env` and a solver/verifier loop."""

from __future__ import annotations

import re

from drmas_envs.core import ListTaskSource, Outcome, Task, TextAECEnv, Turn
from helpers.echo_env import EchoEnv

__all__ = ["EchoEnv", "VerifyLoopEnv"]

_VERDICT = re.compile(r"<verify>(approve|reject)</verify>\s*$")


class VerifyLoopEnv(TextAECEnv):
    """'solver' answers, 'verifier' ends with <verify>approve|reject</verify>; reject loops back (max_loops).

    Solver valid iff its text contains 'answer:'. Verifier valid iff it ends with a verdict (an invalid
    verdict counts as reject). Episode reward: 1 if the verifier approved a solver text containing the
    task's answer, else 0. After ``max_loops`` rejections the episode terminates.
    """

    possible_agents = ["solver", "verifier"]
    metadata = {**TextAECEnv.metadata, "name": "verify_loop"}

    def __init__(self, render_mode=None, format_penalty=0.1, max_loops=2, num_tasks=4):
        tasks = ListTaskSource(
            [Task(f"v{i}", "toy", f"What is {i} + {i}?", str(2 * i)) for i in range(num_tasks)]
        )
        self.max_loops = max_loops
        super().__init__(tasks, format_penalty=format_penalty, render_mode=render_mode)

    def _start_episode(self):
        self._answer, self._approved, self._loops = "", False, 0
        return "solver"

    def _prompt(self, agent):
        if agent == "solver":
            return "You solve. Reply 'answer: N'.", self.task.question
        return "You verify. End with <verify>approve</verify> or <verify>reject</verify>.", (
            f"{self.task.question}\nproposed: {self._answer}"
        )

    def _act(self, agent, text):
        if agent == "solver":
            self._answer = text
            return Turn(valid="answer:" in text, next_agent="verifier")
        match = _VERDICT.search(text)
        if match and match.group(1) == "approve":
            self._approved = True
            return Turn(valid=True, next_agent=None, info={"verdict": "approve"})
        self._loops += 1
        done = self._loops >= self.max_loops
        return Turn(
            valid=match is not None, next_agent=None if done else "solver", info={"verdict": "reject"}
        )

    def _episode_outcome(self):
        won = self._approved and self.task.answer in self._answer
        return Outcome(float(won), won, {"loops": self._loops})
