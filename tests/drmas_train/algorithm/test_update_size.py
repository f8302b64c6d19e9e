"""How far an optimizer step moved the weights: golden values of the sampled relative update and changed share."""

from __future__ import annotations

import math

import pytest
import torch

from drmas_train.algorithm.update_size import UpdateSizeProbe, update_size_metrics


def test_golden_relative_update_and_changed_share():
    p = torch.nn.Parameter(torch.tensor([3.0, 4.0, 1.0, 2.0]))
    p.grad = torch.tensor([1.0, 1.0, 0.0, 1.0])  # the third weight has no gradient
    probe = UpdateSizeProbe([p])
    probe.before()
    with torch.no_grad():
        p.add_(torch.tensor([0.3, 0.0, 0.5, 0.4]))  # the second weight does not move although it had a gradient
    probe.after()
    m = probe.metrics()
    assert m["update_rel"] == pytest.approx(math.sqrt(0.09 + 0.25 + 0.16) / math.sqrt(9 + 16 + 1 + 4))
    assert m["update_changed_frac"] == pytest.approx(2 / 3)  # of the 3 weights with a gradient, 2 changed


def test_sampling_is_strided_and_sums_over_steps_and_shards():
    p = torch.nn.Parameter(torch.arange(10.0))
    p.grad = torch.ones(10)
    probe = UpdateSizeProbe([p], sum_shards=lambda v: 2 * v, sample_per_tensor=5)  # as if 2 ranks held equal shards
    assert probe.index[0].tolist() == [0, 2, 4, 6, 8]
    for _ in range(2):
        probe.before()
        with torch.no_grad():
            p.add_(1.0)
        probe.after()
    m = probe.metrics()
    # sampled before the steps: 0,2,4,6,8 then 1,3,5,7,9; each step adds 1 to all 5 sampled weights
    assert m["update_rel"] == pytest.approx(math.sqrt(10 / (120 + 165)))
    assert m["update_changed_frac"] == 1.0 and probe.steps == 2


def test_no_step_no_metrics_and_no_gradient_is_nan():
    assert update_size_metrics(torch.zeros(4, dtype=torch.float64), 0) == {}
    m = update_size_metrics(torch.tensor([0.0, 4.0, 0.0, 0.0], dtype=torch.float64), 1)
    assert m["update_rel"] == 0.0 and math.isnan(m["update_changed_frac"])
