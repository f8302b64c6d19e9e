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


def _figure_of(monkeypatch, rows, tmp_path) -> Figure:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    figures = []
    original = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (figures.append(self), original(self, *a, **k))[1])
    plot_run(path, tmp_path / "curves.png")
    return figures[0]


@pytest.mark.slow
def test_an_async_run_gets_a_pacing_row_per_model_and_a_sync_run_does_not(tmp_path, monkeypatch):
    """run.mode=async: throughput, staleness (mean, dashed max) and versions (dashed: the generation side's) per
    trained model, drawn from exactly the logged points; a sync run (no async/ metric) keeps the one-row plot."""
    rows = [
        {"iteration": it, "rollout/accuracy": 0.1 * it, "perf/router/tokens_per_s": 50.0 + it,
         "perf/answer/tokens_per_s": 10.0 + it, "staleness/router/mean": 0.0 if it == 1 else 0.5,
         "staleness/router/max": 0.0 if it == 1 else 1.0, "staleness/answer/mean": 0.0, "staleness/answer/max": 0.0,
         "version/router": float(it), "version/answer": float(it), "async/router/generation_version": float(it),
         "async/answer/generation_version": float(it - 1), "async/generated_batches": 1.0}
        for it in (1, 2, 3)
    ]  # fmt: skip
    fig = _figure_of(monkeypatch, rows, tmp_path)
    assert len(fig.axes) == 6  # the top row and one pacing row (no per-agent health logged)
    throughput, staleness, versions = fig.axes[3:]
    assert throughput.get_title() == "generation throughput per model"
    lines = {ln.get_label(): list(ln.get_ydata()) for ln in throughput.lines}
    assert lines == {"answer": [11.0, 12.0, 13.0], "router": [51.0, 52.0, 53.0]}
    lines = {ln.get_label(): (list(ln.get_ydata()), ln.get_linestyle()) for ln in staleness.lines}
    assert lines["router"] == ([0.0, 0.5, 0.5], "-") and lines["router max"] == ([0.0, 1.0, 1.0], "--")
    lines = {ln.get_label(): list(ln.get_ydata()) for ln in versions.lines}
    assert lines["answer generation"] == [0.0, 1.0, 2.0] and lines["router"] == [1.0, 2.0, 3.0]
    sync = [{k: v for k, v in r.items() if not k.startswith("async/")} for r in rows]
    assert len(_figure_of(monkeypatch, sync, tmp_path).axes) == 3


@pytest.mark.slow
def test_a_game_run_plots_its_validation_return_and_paired_gain(tmp_path, monkeypatch):
    rows = [
        {"iteration": 0, "val/random-v0/all/return": -0.1, "val/random-v0/all/return_se": 0.2},
        {"iteration": 1, "reward/player_0/mean": 0.1, "reward/player_1/mean": -0.2, "loss/shared/grad_norm": 0.5,
         "val/random-v0/all/return": 0.3, "val/random-v0/all/return_se": 0.1, "val/random-v0/return_gain": 0.4,
         "val/random-v0/return_gain_se": 0.15, "val/random-v0/player_0/return": 0.5},
    ]  # fmt: skip
    fig = _figure_of(monkeypatch, rows, tmp_path)
    reward = fig.axes[1]
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in reward.lines}
    assert lines == {"player_0": ([1], [0.1]), "player_1": ([1], [-0.2]),
                     "validation return vs random-v0": ([0, 1], [-0.1, 0.3])}  # fmt: skip
    bars = [c for c in reward.collections if len(c.get_segments())]
    ends = [float(v) for seg in bars[0].get_segments() for p in seg for v in p]  # +- one SE at each validation
    assert ends == pytest.approx([0.0, -0.3, 0.0, 0.1, 1.0, 0.2, 1.0, 0.4])
    assert reward.get_title() == "reward per agent (mean), validation return"
    assert [t.get_text() for t in reward.texts] == [
        "return gain vs random-v0, iteration 0 -> 1: +0.400 ± 0.150 (paired SE)"]
