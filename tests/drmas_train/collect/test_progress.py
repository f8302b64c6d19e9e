"""Progress that says what it is and moves: during each lock-step generate call a bar of decoded tokens whose
total is the call's remaining allowance (it becomes the exact count as rows finish), labelled with the rollout's
purpose (training rollout, validation, eval), the step, the model and the number of calls."""

from __future__ import annotations

import inspect
import os
import re

import pytest

from helpers.backend_fakes import ScriptedBackend
from helpers.tiny_rl import ENV_ID, tiny_loader

pytest.importorskip("transformers")

from drmas_train.backends.base import SamplingParams, reports_tokens  # noqa: E402
from drmas_train.backends.hf import HFBackend  # noqa: E402
from drmas_train.collect.rollout import rollout  # noqa: E402
from drmas_train.model.assignment import ModelPool  # noqa: E402


def test_token_bar_moves_within_each_generate_call(monkeypatch):
    import drmas_train.collect.progress as progress

    bars = []

    class Recorder:
        def __init__(self, total=None, disable=False, desc="", **kwargs):
            self.total, self.disable, self.desc, self.n, self.updates, self.kwargs = total, disable, desc, 0, 0, kwargs
            self.totals = [total]  # the total after each update
            bars.append(self)

        def update(self, k):
            self.n, self.updates = self.n + k, self.updates + 1
            self.totals.append(self.total)

        def refresh(self):
            pass

        def close(self):
            pass

    monkeypatch.setattr(progress, "progress_bar", Recorder)
    from drmas_train.model.models import ModelSpec

    loaded = tiny_loader(ModelSpec("tiny"), "m")
    backend = HFBackend.from_loaded(loaded)
    assert reports_tokens(backend) and not reports_tokens(ScriptedBackend())
    calls = []
    original = backend.generate

    def counting_generate(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    counting_generate.__signature__ = inspect.signature(original)  # still reports tokens
    monkeypatch.setattr(backend, "generate", counting_generate)
    pool = ModelPool({"m": loaded}, {"m": backend}, {"*": "m"})
    result = rollout(ENV_ID, [0, 1], 2, pool, SamplingParams(max_new_tokens=4), seed=0, progress=True,
                     label="validation")

    episode_bar, *token_bars = bars
    assert episode_bar.desc == "validation: episodes done" and episode_bar.kwargs["unit"] == "ep"
    assert episode_bar.n == 4 and len(calls) == 2  # one batched call per agent turn (a, then b)
    assert [b.desc for b in token_bars] == ["validation · step 1 · m · 4 calls", "validation · step 2 · m · 4 calls"]
    for bar, agent in zip(token_bars, ["a", "b"], strict=True):
        produced = sum(len(s.response_ids) for s in result.samples if s.agent_id == agent)
        assert bar.kwargs["unit"] == "tok" and bar.totals[0] == 4 * 4  # 4 calls x 4 new tokens at most
        assert bar.n == produced and bar.total == produced  # every sampled token (EOS included); exact at the end
        assert bar.updates > 1  # updated inside the call, once per decode step
        assert all(a >= b for a, b in zip(bar.totals, bar.totals[1:], strict=False))  # the total only tightens


def test_token_progress_total_tightens_as_rows_finish():
    from drmas_train.collect.progress import TokenProgress

    bar = TokenProgress(3, 10, desc="t")
    bar([0, 1, 2], [5, 5, 5])
    assert bar.bar.total == 30
    bar([0, 2], [5, 5])  # row 1 finished after 1 token: its 9 unused tokens leave the total
    assert bar.bar.total == 21 and bar.bar.n == 5
    bar([2], [5])  # row 0 finished after 2 tokens
    assert bar.bar.total == 13
    bar.close()
    assert bar.bar.total == bar.bar.n == 6 == sum(bar.produced.values())


def test_progress_in_a_log_is_one_plain_line_per_update(monkeypatch):
    """Where the stream is not a terminal, progress_bar gives a LineProgress: lines ending in a newline at most every
    mininterval seconds, the last state once at close, no carriage return and no cursor movement; tqdm.write (what
    logging_redirect_tqdm calls) neither erases nor redraws it."""
    import io

    import tqdm as tqdm_module

    from drmas_train.collect.progress import LOG_INTERVAL_S, LineProgress, progress_bar

    log = io.StringIO()
    clock = iter(range(0, 1000, 4))  # tqdm's clock: 4 s per reading
    monkeypatch.setattr("tqdm.std.time", lambda: float(next(clock)))
    bar = progress_bar(total=10, desc="rollout", unit="ep", file=log, miniters=1)
    assert isinstance(bar, LineProgress) and bar.mininterval == LOG_INTERVAL_S == 10.0
    for _ in range(10):
        bar.update(1)
    tqdm_module.tqdm.write("iter 1: reward 0.5", file=log)
    bar.close()
    text = log.getvalue()
    assert "\r" not in text and "\x1b[" not in text
    lines = text.splitlines()
    assert all(line.startswith("rollout: ") for line in lines if line != "iter 1: reward 0.5")
    assert re.match(r"rollout: 100%\|#+\| 10/10 \[", lines[-1]) and lines[-2] == "iter 1: reward 0.5", lines
    # progress lines while it ran: at least 10 s apart (tqdm reads its clock twice per update here: 8 s per update),
    # so fewer lines than updates, each further on
    done = [int(re.match(r"rollout: +\d+%\|[# .0-9]*\| (\d+)/10 \[", line)[1]) for line in lines[:-2]]
    assert 2 <= len(done) < 10 and done == sorted(set(done)) and done[-1] < 10, lines

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    on_terminal = progress_bar(total=1, file=Terminal())
    assert not isinstance(on_terminal, LineProgress)
    on_terminal.close()


def test_a_generate_calls_last_line_is_written_once_in_a_log(monkeypatch):
    """Before: a call whose last update wrote its line wrote it again at close (``validation · step 1 ...
    3143/3143 [25:17<00:00, 1.05s/tok]`` twice in a run's log)."""
    import io

    from drmas_train.collect.progress import TokenProgress

    clock = iter(range(0, 1000, 20))  # tqdm's clock: 20 s per reading, so every update writes a line
    monkeypatch.setattr("tqdm.std.time", lambda: float(next(clock)))
    log = io.StringIO()
    monkeypatch.setattr("sys.stderr", log)
    bar = TokenProgress(2, 3, desc="validation")
    bar([0, 1], [5, 5])
    bar([0, 1], [5, 5])
    bar([0, 1], [5, 5])  # both rows used their whole allowance: the total is already exact
    bar.close()
    counts = [re.search(r"\| (\d+/\d+) \[", line)[1] for line in log.getvalue().splitlines()]
    assert counts == ["2/6", "4/6", "6/6"], log.getvalue()


@pytest.mark.slow  # a drmas eval subprocess, ~3 s
def test_cli_progress_written_to_a_file_has_no_carriage_returns(tmp_path):
    """drmas eval 2> log: the log reads line by line (issue 40: '\\r' and 'ESC[A' sequences before)."""
    import subprocess
    import sys

    argv = ["-m", "drmas_train.cli", "eval", "--env", "math-solver-verifier-v0", "--policy", "oracle", "--limit", "50",
            "--k", "2", "--out", str(tmp_path / "out")]  # fmt: skip
    with (tmp_path / "log").open("w") as log:
        assert subprocess.run([sys.executable, *argv], stderr=log, stdout=subprocess.DEVNULL, timeout=120).returncode == 0
    text = (tmp_path / "log").read_text()
    assert "\r" not in text and "\x1b[" not in text
    assert re.match(r"eval oracle: episodes done: 100%\|#+\| 100/100 \[", text.splitlines()[-1]), text


@pytest.mark.slow  # loads SmolLM2 (from_pretrained draws transformers' "Loading weights" bar on a terminal)
def test_the_hugging_face_bars_stay_out_of_a_log(tmp_path):
    """drmas <command> 2> log: transformers' own bars (loading, saving weights) are off when stderr is not a terminal."""
    import subprocess
    import sys

    argv = ["-m", "drmas_train.cli", "play", "--env", "math-solver-v0", "--policy", "llm", "--model",
            "smollm2-135m-instruct", "--max-new-tokens", "2"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"} | {"HF_HUB_OFFLINE": "1"}
    with (tmp_path / "log").open("w") as log:
        done = subprocess.run([sys.executable, *argv], stderr=log, stdout=subprocess.DEVNULL, timeout=300, env=env)
    text = (tmp_path / "log").read_text()
    assert done.returncode == 0, text[-2000:]
    assert "Loading weights" not in text and "\r" not in text and "\x1b[" not in text, text[-2000:]
