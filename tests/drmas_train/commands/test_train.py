"""``drmas train``'s last lines as a user reads them: "done in" is the command's wall time, split into start-up
and training."""

from __future__ import annotations

import types

import pytest

from drmas_train.cli import main as cli_main


@pytest.mark.parametrize(
    ("resumed_from", "expected"),
    [
        (None, "done in 150s (start-up and model loading 90s, training 60s); run dir runs/x"),
        (4, "done in 150s (start-up and model loading 90s, training 60s; the whole run's training, resumes "
            "included: 95s); run dir runs/x"),
    ],
)
def test_done_in_is_the_commands_wall_time(tmp_path, capsys, monkeypatch, resumed_from, expected):
    """Before: ``done in 59s (the whole run, resumes included: 75s)`` for a resume that took 177 s, of which 118 s
    loading (the figure was the training loop's alone)."""
    import drmas_train.commands.train as command
    import drmas_train.run.trainer as trainer

    clock = iter([100.0, 250.0])  # the command starts at 100 s and prints at 250 s
    monkeypatch.setattr(command, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    summary = {"run_dir": "runs/x", "process_wall_time_s": 60.2, "wall_time_s": 95.0, "resumed_from": resumed_from,
               "plot": None, "checkpoint": None}  # fmt: skip
    monkeypatch.setattr(trainer, "train", lambda cfg, **kwargs: summary)
    assert cli_main(["train", f"run.dir={tmp_path / 'run'}"]) == 0
    assert capsys.readouterr().out.splitlines() == [expected]
