"""The quickstart's recipe presets (``quickstart_math_<name>``): each differs from ``quickstart_math`` only in its
recipe's keys (and its run directory), and each runs one iteration end to end on a tiny random model."""

from __future__ import annotations

import dataclasses

import pytest

from drmas_train.run.config import as_dict, load_config
from drmas_train.run.metrics_log import read_metrics
from drmas_train.run.trainer import train

#: preset -> the keys whose values it changes (section.key -> value), besides run.dir and run.name (the DAPO
#: preset also names its overlong penalty factor, 1.0, which is the default)
RECIPES = {
    "quickstart_math_gae": {"algorithm.estimator": "gae", "critic.lr": 2e-4},
    "quickstart_math_dapo": {
        "rollout.filter_groups": True,
        "rollout.filter_groups_max_batches": 3,
        "algorithm.clip_high": 0.28,
        "algorithm.overlong_buffer": 8,
    },  # fmt: skip
    "quickstart_math_kl_reward": {
        "algorithm.reward_kl_coef": 0.001,
        "algorithm.reward_kl_control": "adaptive",
    },
}


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and k not in ("agents", "models", "kwargs", "data_options"):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_recipe_preset_differs_from_the_quickstart_only_in_its_recipe(name):
    base, preset = _flat(as_dict(load_config("quickstart_math"))), _flat(as_dict(load_config(name)))
    changed = {k: v for k, v in preset.items() if base[k] != v and k not in ("run.dir", "run.name")}
    assert changed == RECIPES[name]
    assert preset["run.dir"] == f"runs/{name}"


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_recipe_preset_runs_one_iteration_on_a_tiny_model(tmp_path, name):
    cfg = load_config(name, [f"run.dir={tmp_path / name}", "models.shared.name_or_path=tiny-llama", "run.iterations=1",
                             "rollout.batch_size=2", "rollout.group_size=2", "rollout.max_new_tokens=10",
                             "eval.every=0", "run.save_samples=false", "run.tensorboard=false", "run.plot=false",
                             "run.progress=false", "run.num_threads=1", "env.data_options.size=8"])  # fmt: skip
    if name == "quickstart_math_dapo":
        cfg = dataclasses.replace(
            cfg, algorithm=dataclasses.replace(cfg.algorithm, overlong_buffer=4)
        )  # < 10 tokens
    train(cfg)
    row = read_metrics(tmp_path / name / "metrics.jsonl")[-1]
    assert row["iteration"] == 1 and ("loss/shared/grad_norm" in row or row.get("rollout/groups_kept") == 0)
    assert {"quickstart_math_gae": "critic/shared/vf_loss", "quickstart_math_dapo": "rollout/gen_batches",
            "quickstart_math_kl_reward": "reward/kl_coef"}[name] in row  # fmt: skip
