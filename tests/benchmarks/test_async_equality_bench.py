"""benchmarks/perf/async_equality.py's comparisons on hand-built runs (the two real runs are measured by hand)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from helpers.scripts import load_script

bench = load_script("benchmarks/perf/async_equality.py")


def test_metrics_are_compared_per_iteration_on_the_training_families_only():
    sync = [{"iteration": 1, "reward/a/mean": 0.5, "loss/m/pg_loss": 0.1, "perf/iteration_s": 3.0}]
    same = [{"iteration": 1, "reward/a/mean": 0.5, "loss/m/pg_loss": 0.1, "perf/iteration_s": 9.0, "async/x": 1.0}]
    assert bench.compare_metrics(sync, same) == {"equal_metrics": True, "compared_keys": 2, "differing": {},
                                                 "differing_diagnostics": {}}  # fmt: skip
    other = [{"iteration": 1, "reward/a/mean": 0.5, "loss/m/pg_loss": 0.1000001}]
    out = bench.compare_metrics(sync, other)
    assert not out["equal_metrics"] and out["differing"] == {"1:loss/m/pg_loss": [0.1, 0.1000001]}
    # the engine-vs-trainer log-prob diagnostics are reported apart and do not make the runs differ
    sync[0]["loss/m/old_logprob_abs_diff_mean"], same[0]["loss/m/old_logprob_abs_diff_mean"] = 2.47e-6, 2.48e-6
    out = bench.compare_metrics(sync, same)
    assert out["equal_metrics"] and out["differing_diagnostics"] == {"1:loss/m/old_logprob_abs_diff_mean": [2.47e-6, 2.48e-6]}
    with pytest.raises(ValueError, match="different iterations"):
        bench.compare_metrics(sync, [{"iteration": 2}])


def test_weights_are_compared_bit_for_bit(tmp_path):
    def write(run, tensors):
        folder = run / "checkpoints" / "iter_000002" / "models" / "shared"
        folder.mkdir(parents=True)
        save_file(tensors, str(folder / "model.safetensors"))

    w = {"a": torch.arange(4.0), "b": torch.ones(2, 2)}
    write(tmp_path / "sync", w)
    write(tmp_path / "same", {k: t.clone() for k, t in w.items()})
    write(tmp_path / "off", {"a": torch.arange(4.0) + torch.tensor([0, 0, 0, 2.0**-20]), "b": torch.ones(2, 2)})
    assert bench.compare_weights(tmp_path / "sync", tmp_path / "same", 2) == {
        "equal_weights": True, "tensors": 2, "max_abs_weight_diff": 0.0}  # fmt: skip
    off = bench.compare_weights(tmp_path / "sync", tmp_path / "off", 2)
    assert not off["equal_weights"] and off["max_abs_weight_diff"] == 2.0**-20  # exact in float32 at 3.0
