"""A tiny two-agent env on the text base, for testing the base itself."""

from drmas_envs.core import ListTaskSource, Outcome, Task, TextAECEnv, Turn


class EchoEnv(TextAECEnv):
    """'a' then 'b' each say something; valid iff it contains 'ok'; reward 1 if b says the answer."""

    possible_agents = ["a", "b"]
    metadata = {**TextAECEnv.metadata, "name": "echo"}

    def __init__(self, render_mode=None, format_penalty=0.1):
        tasks = ListTaskSource([Task(f"t{i}", "echo", f"say {i}", str(i)) for i in range(5)])
        super().__init__(tasks, format_penalty=format_penalty, render_mode=render_mode)

    def _start_episode(self):
        self._last = ""
        return "a"

    def _prompt(self, agent):
        return f"You are {agent}.", f"{self.task.question}\nprevious: {self._last}"

    def _act(self, agent, text):
        self._last = text
        return Turn(valid="ok" in text, next_agent="b" if agent == "a" else None)

    def _episode_outcome(self):
        won = self.task.answer in self._last
        return Outcome(float(won), won, {"answer": self._last})
