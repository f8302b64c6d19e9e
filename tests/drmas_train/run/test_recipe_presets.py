"""The quickstart's recipe presets (``quickstart_math_<name>``): each differs from ``quickstart_math`` only in its
recipe's keys (and its run directory), and each runs one iteration end to end on a tiny random model.

One preset per advantage estimator of the registry (``benchmarks/estimators.py`` runs them side by side), plus the
loss/reward recipes (DAPO, KL in the reward) and the normalisation matrix's arms (``quickstart_math_cell_*``)."""

from __future__ import annotations

import dataclasses

import pytest

from drmas_train.algorithm.advantages import ESTIMATORS
from drmas_train.run.config import as_dict, list_presets, load_config
from drmas_train.run.metrics_log import read_metrics
from drmas_train.run.trainer import train

#: preset -> the keys whose values it changes (section.key -> value), besides run.dir and run.name (the DAPO
#: preset also names its overlong penalty factor, 1.0, which is the default)
RECIPES = {
    "quickstart_math_grpo": {"algorithm.estimator": "grpo"},
    "quickstart_math_grpo_step": {"algorithm.estimator": "grpo_step"},
    "quickstart_math_per_turn": {"algorithm.estimator": "per_turn"},
    "quickstart_math_rloo": {"algorithm.estimator": "rloo"},
    "quickstart_math_reinforce_pp": {"algorithm.estimator": "reinforce_pp"},
    "quickstart_math_reinforce_pp_baseline": {"algorithm.estimator": "reinforce_pp_baseline"},
    "quickstart_math_grpo_passk": {"algorithm.estimator": "grpo_passk"},
    "quickstart_math_gigpo": {"algorithm.estimator": "gigpo", "algorithm.gamma": 0.95},
    "quickstart_math_remax": {"algorithm.estimator": "remax"},
    "quickstart_math_dr_grpo": {
        "algorithm.estimator": "grpo",
        "algorithm.norm_by_std": False,
        "algorithm.loss_agg": "seq-mean-token-sum",
    },
    "quickstart_math_gae": {"algorithm.estimator": "gae", "critic.lr": 2e-4},
    # the normalisation-matrix arms that no estimator preset already is (benchmarks/normalisation_matrix/PROTOCOL.md):
    # quickstart_math (drmas), quickstart_math_grpo and quickstart_math_grpo_step are the three others
    "quickstart_math_cell_agent_traj": {"algorithm.grouping": "prompt_agent", "algorithm.units": "trajectory"},
    "quickstart_math_cell_agent_call_mean": {"algorithm.scale": "mean"},
    "quickstart_math_cell_agent_call_batchstd": {"algorithm.scale": "batch_std"},
    "quickstart_math_cell_agent_traj_mean": {"algorithm.grouping": "prompt_agent", "algorithm.units": "trajectory",
                                             "algorithm.scale": "mean"},
    "quickstart_math_cell_agent_traj_batchstd": {"algorithm.grouping": "prompt_agent", "algorithm.units": "trajectory",
                                                 "algorithm.scale": "batch_std"},
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
#: team presets (benchmarks/paper_effect/PROTOCOL.md): quickstart_math with other models per agent, and their GRPO
#: twins -> (the models section, the agents section, the estimator); the rest must be quickstart_math's
TEAMS = {
    "quickstart_math_nonsharing": (
        {"solver_model": {"name_or_path": "smollm2-135m-instruct"},
         "verifier_model": {"name_or_path": "smollm2-135m-instruct"}},
        {"solver": "solver_model", "verifier": "verifier_model"}, "drmas"),
    "quickstart_math_lora_agents": (
        {"base": {"name_or_path": "smollm2-135m-instruct", "lr": 2e-4,
                  "adapters": {"solver": {"r": 16, "alpha": 32}, "verifier": {"r": 16, "alpha": 32}}}},
        {"solver": "base:solver", "verifier": "base:verifier"}, "drmas"),
}  # fmt: skip
TEAMS |= {f"{name}_grpo": (models, agents, "grpo") for name, (models, agents, _) in TEAMS.items()}
#: the metric only a preset's recipe writes (the others: the policy's grad norm, which every update logs)
MARKERS = {"quickstart_math_gae": "critic/shared/vf_loss", "quickstart_math_dapo": "rollout/gen_batches",
           "quickstart_math_kl_reward": "reward/kl_coef", "quickstart_math_remax": "rollout/greedy_score_mean"}  # fmt: skip


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and k not in ("agents", "models", "kwargs", "data_options"):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_every_quickstart_math_preset_is_listed_and_every_estimator_has_one():
    presets = {n for n in list_presets() if n.startswith("quickstart_math_")}
    assert presets == set(RECIPES) | set(TEAMS)
    covered = {"drmas"} | {r["algorithm.estimator"] for r in RECIPES.values() if "algorithm.estimator" in r}
    assert covered == set(ESTIMATORS)  # quickstart_math itself is the drmas one


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_recipe_preset_differs_from_the_quickstart_only_in_its_recipe(name):
    base, preset = _flat(as_dict(load_config("quickstart_math"))), _flat(as_dict(load_config(name)))
    changed = {k: v for k, v in preset.items() if base[k] != v and k not in ("run.dir", "run.name")}
    assert changed == RECIPES[name]
    assert preset["run.dir"] == f"runs/{name}"
    assert {k.split(".")[0] for k in changed} <= {"algorithm", "rollout", "critic"}


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
    assert MARKERS.get(name, "loss/shared/grad_norm") in row
    if "loss/shared/grad_norm" in row:  # DAPO may keep no group of a tiny model's batch, and then not update
        assert {"adv/solver/mean", "adv/verifier/mean"} <= set(
            row
        )  # both agents' calls reached the estimator


def _model_subset(full: dict, expected: dict) -> dict:
    """The keys of ``full`` (a resolved model section) that ``expected`` names, recursively."""
    return {k: _model_subset(full[k], v) if isinstance(v, dict) else full[k] for k, v in expected.items()}


@pytest.mark.parametrize("name", sorted(TEAMS))
def test_a_team_preset_differs_from_the_quickstart_only_in_its_models_and_estimator(name):
    models, agents, estimator = TEAMS[name]
    base, preset = as_dict(load_config("quickstart_math")), as_dict(load_config(name))
    assert preset["agents"] == agents and preset["algorithm"]["estimator"] == estimator
    assert set(preset["models"]) == set(models) and _model_subset(preset["models"], models) == models
    for section in ("env", "rollout", "optim", "eval", "critic"):
        assert preset[section] == base[section], section
    assert {k: v for k, v in preset["algorithm"].items() if k != "estimator"} == {
        k: v for k, v in base["algorithm"].items() if k != "estimator"
    }
    assert preset["run"]["dir"] == f"runs/{name}" and preset["seed"] == base["seed"]


@pytest.mark.parametrize("name", ["quickstart_math_nonsharing", "quickstart_math_lora_agents"])
def test_a_team_preset_runs_one_iteration_on_a_tiny_model(tmp_path, name):
    keys = list(TEAMS[name][0])
    cfg = load_config(name, [f"run.dir={tmp_path / name}", "run.iterations=1", "rollout.batch_size=2",
                             "rollout.group_size=2", "rollout.max_new_tokens=10", "eval.every=0",
                             "run.save_samples=false", "run.tensorboard=false", "run.plot=false",
                             "run.progress=false", "run.num_threads=1", "env.data_options.size=8"]
                      + [f"models.{k}.name_or_path=tiny-llama" for k in keys])  # fmt: skip
    train(cfg)
    row = read_metrics(tmp_path / name / "metrics.jsonl")[-1]
    trained = {k.split("/")[1] for k in row if k.startswith("loss/") and k.endswith("/grad_norm")}
    # one update per model key, or per adapter: every agent's own parameters moved under its own optimizer
    assert trained == set(TEAMS[name][1].values())


def test_the_search_quickstart_grpo_twin_differs_only_in_the_estimator():
    """quickstart_search_grpo is quickstart_search with the GRPO estimator (docs/quickstart.md compares the two)."""
    base, twin = _flat(as_dict(load_config("quickstart_search"))), _flat(as_dict(load_config("quickstart_search_grpo")))
    changed = {k: v for k, v in twin.items() if base[k] != v and k not in ("run.dir", "run.name")}
    assert changed == {"algorithm.estimator": "grpo"} and base["algorithm.estimator"] == "drmas"
    assert twin["run.dir"] == "runs/quickstart_search_grpo"
