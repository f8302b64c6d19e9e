"""The training plot: accuracy (train and validation), reward per agent, grad norm per model."""

from __future__ import annotations

import json

import pytest
from matplotlib.figure import Figure

from drmas_train.run.metrics_log import plot_run


@pytest.mark.slow
def test_plot_has_train_and_validation_accuracy(tmp_path, monkeypatch):
    rows = [
        {"iteration": 1, "rollout/accuracy": 0.25, "reward/solver/mean": 0.1, "loss/shared/grad_norm": 0.5},
        {"iteration": 2, "rollout/accuracy": 0.5, "reward/solver/mean": 0.2, "loss/shared/grad_norm": 0.4,
         "val/avg@4": 0.375, "val/avg@4_stderr": 0.1, "val/pass@4": 0.6},
        {"iteration": 3, "rollout/accuracy": None, "reward/solver/mean": 0.3, "loss/shared/grad_norm": 0.3},
        {"iteration": 4, "rollout/accuracy": 0.75, "val/avg@4": 0.5, "val/avg@4_stderr": 0.05,
         "val/avg@4_gain": 0.125, "val/avg@4_gain_stderr": 0.02},
    ]  # fmt: skip
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    figures = []
    original = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (figures.append(self), original(self, *a, **k))[1])
    out = plot_run(path, tmp_path / "curves.png", title="quickstart_math · estimator drmas · smollm2-135m-instruct")
    assert out.stat().st_size > 1000
    assert figures[0]._suptitle.get_text() == "quickstart_math · estimator drmas · smollm2-135m-instruct"
    acc, reward, grad = figures[0].axes
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in acc.lines}
    assert lines == {"train (rollout)": ([1, 2, 4], [0.25, 0.5, 0.75]), "validation avg@4": ([2, 4], [0.375, 0.5])}
    bars = [c for c in acc.collections if len(c.get_segments())]  # the validation error bars: +- one stderr
    assert [[tuple(map(float, p)) for p in seg] for seg in bars[0].get_segments()] == [
        [(2.0, 0.275), (2.0, 0.475)], [(4.0, 0.45), (4.0, 0.55)]]
    assert [line.get_label() for line in reward.lines] == ["solver"]
    assert [line.get_label() for line in grad.lines] == ["shared"]
    assert acc.get_title() == "accuracy"
    # the headline figure: the latest paired held-out gain over iteration 0, with its standard error
    assert [t.get_text() for t in acc.texts] == ["held-out avg@4 gain, iteration 0 -> 4:\n+0.125 ± 0.020 (paired SE)"]


def test_plot_of_an_empty_file_is_an_error(tmp_path):
    (tmp_path / "m.jsonl").write_text("")
    with pytest.raises(ValueError, match="holds no metrics rows"):
        plot_run(tmp_path / "m.jsonl", tmp_path / "x.png")
