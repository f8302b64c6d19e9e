"""What per-model pacing (``run.pacing=per_model``) accepts of the normalisation matrix (docs/advantages.md): with
several trained models a statistic must not pool models, so per-agent cells pass over both units and a batch std is
refused."""

from __future__ import annotations

import re

import pytest

from drmas_train.run.config import ConfigError, validate_config
from helpers.tiny_rl import tiny_config

PER_MODEL = ("run.mode=async", "run.pacing=per_model", "distributed.enabled=true", "distributed.colocate=false",
             "models.m2.name_or_path=tiny", "agents.b=m2")  # fmt: skip


def test_per_model_pacing_takes_the_per_agent_cells_over_both_units(tmp_path):
    for units in ("trajectory", "call"):
        cfg = tiny_config(tmp_path / "run", *PER_MODEL, "algorithm.grouping=prompt_agent", f"algorithm.units={units}",
                          "algorithm.scale=mean")  # fmt: skip
        assert (cfg.run.pacing, cfg.algorithm.units) == ("per_model", units)


def test_per_model_pacing_refuses_a_batch_std_and_a_global_grouping_over_calls(tmp_path):
    with pytest.raises(ConfigError, match=re.escape(
            "run.pacing=per_model with algorithm.scale=batch_std and 2 trained models: its std pools the whole batch, "
            "whose models would differ from step to step; accepted: algorithm.scale std or mean, or "
            "run.pacing=lockstep")):  # fmt: skip
        validate_config(tiny_config(tmp_path / "run", *PER_MODEL, "algorithm.scale=batch_std"))
    with pytest.raises(ConfigError, match=re.escape("run.pacing=per_model with grouping 'prompt' and 2 trained models")):
        validate_config(tiny_config(tmp_path / "run", *PER_MODEL, "algorithm.estimator=grpo", "algorithm.units=call"))
