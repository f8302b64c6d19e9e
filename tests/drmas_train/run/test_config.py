"""Config: presets load, overrides apply, and every bad config fails with a clear error before models load."""

from __future__ import annotations

import pytest

from drmas_train.commands.train import main as train_main
from drmas_train.run.config import ConfigError, from_yaml, list_presets, load_config, to_yaml

PRESETS = [
    "quickstart_math",
    "drmas_math_qwen3_4b", "drmas_math_qwen3_4b_nonsharing", "drmas_math_qwen3_4b_hetero",
    "drmas_search_qwen25_3b", "drmas_search_qwen25_3b_nonsharing", "drmas_search_qwen25_3b_hetero",
]  # fmt: skip


@pytest.mark.slow
def test_all_presets_load_and_grpo_twins_differ_only_in_estimator():
    names = list_presets()
    for name in PRESETS:
        assert name in names
        cfg = load_config(name)
        if name.startswith("drmas_"):
            twin = load_config("grpo_" + name[len("drmas_") :])
            assert (cfg.algorithm.estimator, twin.algorithm.estimator) == ("drmas", "grpo")
            assert twin.run.name == "grpo_" + name[len("drmas_") :]  # the plot title names the preset run
            twin.algorithm.estimator, twin.run.dir, twin.run.name = "drmas", cfg.run.dir, cfg.run.name
            assert twin == cfg


def test_reference_hyperparameters():
    m = load_config("drmas_math_qwen3_4b")
    assert (m.rollout.group_size, m.rollout.batch_size, m.env.kwargs["max_loops"], m.env.kwargs["format_penalty"]) == (8, 32, 2, 0.1)
    assert (m.rollout.max_new_tokens, m.optim.lr, m.algorithm.kl_coef, m.algorithm.entropy_coef) == (4096, 1e-6, 0.0, 0.0)
    s = load_config("drmas_search_qwen25_3b")
    assert (s.rollout.group_size, s.rollout.batch_size, s.env.kwargs["max_steps"], s.env.kwargs["topk"]) == (5, 128, 4, 3)
    assert (s.env.kwargs["format_penalty"], s.rollout.max_new_tokens, s.algorithm.mini_batches) == (0.01, 800, 5)
    q = load_config("quickstart_math")
    assert q.agents == {"solver": "shared", "verifier": "shared"} and q.models["shared"].name_or_path == "smollm2-135m-instruct"
    assert q.env.data == "reasoning_gym:basic_arithmetic" and q.algorithm.estimator == "drmas"
    assert q.env.data_options["size"] == 100 and q.eval.before_train and q.eval.every > 0  # held-out before/after
    twin = load_config("quickstart_math_grpo")  # the README job's GRPO twin: only the estimator (and run.dir) differ
    assert (twin.algorithm.estimator, twin.run.dir) == ("grpo", "runs/quickstart_math_grpo")
    twin.algorithm.estimator, twin.run.dir, twin.run.name = "drmas", q.run.dir, q.run.name
    assert twin == q
    ns = load_config("drmas_math_qwen3_4b_nonsharing")
    assert ns.agents == {"solver": "solver_model", "verifier": "verifier_model"} and "shared" not in ns.models


def test_grouping_is_one_setting_away_and_round_trips():
    cfg = load_config("quickstart_math", ["algorithm.estimator=rloo", "algorithm.grouping=prompt_agent"])
    assert (cfg.algorithm.estimator, cfg.algorithm.grouping) == ("rloo", "prompt_agent")
    assert from_yaml(to_yaml(cfg)) == cfg
    default = load_config("quickstart_math")
    assert default.algorithm.grouping is None and from_yaml(to_yaml(default)).algorithm.grouping is None
    gigpo = load_config("quickstart_math", ["algorithm.estimator=gigpo", "algorithm.gamma=0.95",
                                            "algorithm.gigpo_step_weight=0.5"])  # fmt: skip
    assert (gigpo.algorithm.gamma, gigpo.algorithm.gigpo_step_weight) == (0.95, 0.5)


def test_overrides_types_and_yaml_round_trip(tmp_path):
    cfg = load_config(None, ["rollout.group_size=3", "algorithm.estimator=grpo_step", "models.shared.lr=2e-6"])
    assert cfg.rollout.group_size == 3 and cfg.algorithm.estimator == "grpo_step" and cfg.models["shared"].lr == 2e-6
    assert from_yaml(to_yaml(cfg)) == cfg
    # the README form "--config configs/X.yaml" resolves to the bundled preset from any directory
    assert load_config("configs/quickstart_math.yaml") == load_config("quickstart_math")
    path = tmp_path / "mine.yaml"
    path.write_text("extends: quickstart_math\nrollout: {group_size: 2}\n")
    assert load_config(str(path)).rollout.group_size == 2


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algorithm.estimatr=drmas"], r"^unknown config key 'algorithm.estimatr'\. Did you mean one of: 'estimator', 'kl_estimator'\? Valid keys of algorithm: estimator, "),
        (["rollout.group_size=four"], r"Value 'four' of type 'str' could not be converted to Integer"),
        (["algorithm.estimator=drmsa"], r"algorithm.estimator: unknown advantage estimator 'drmsa'; accepted: "
                                        r"\['drmas', 'gae', 'gigpo', 'grpo', 'grpo_passk', 'grpo_step', 'per_turn', "
                                        r"'reinforce_pp', 'reinforce_pp_baseline', 'remax', 'rloo'\]\. "
                                        r"Did you mean 'drmas'\?"),
        (["algorithm.grouping=agent"], r"algorithm.grouping='agent'; accepted: null \(the estimator's own\), prompt, "
                                       r"prompt_call, prompt_agent, prompt_agent_turn"),
        (["algorithm.estimator=reinforce_pp", "algorithm.grouping=prompt"],
         r"algorithm.grouping='prompt': reinforce_pp has no group baseline; accepted: null"),
        (["algorithm.estimator=reinforce_pp", "algorithm.gamma=0.95"],
         r"algorithm.gamma=0.95: reinforce_pp gives one advantage per call, which needs gamma = 1 .*accepted: 1"),
        (["algorithm.gamma=1.5"], r"algorithm.gamma must be in \[0, 1\], got 1.5"),
        (["agents.verifier=sharde"], r"agents.verifier='sharde' names no model; defined models: \['shared'\]\. "
                                     r"Did you mean 'shared'\?"),
        (["algorithm.loss_agg=mean"], r"algorithm.loss_agg='mean'; accepted: \['token-mean'"),
        (["rollout.temperature=0"], r"rollout.temperature must be > 0 for training"),
        (["group_size"], r"override 'group_size' must look like key=value"),
    ],
)  # fmt: skip
def test_bad_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("quickstart_math", overrides)


def test_unknown_preset_suggests():
    with pytest.raises(ConfigError, match=r"config 'quickstart_maths' is neither a YAML file nor a preset; presets: .*"
                                          r"Did you mean 'quickstart_math'\?"):  # fmt: skip
        load_config("quickstart_maths")


def test_cli_bad_config_exits_2_before_loading(capsys, monkeypatch):
    import drmas_train.model.models as models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    assert train_main(["algorithm.estimator=gpro"]) == 2
    assert "Did you mean 'grpo'?" in capsys.readouterr().err
    assert train_main(["--print-config", "rollout.group_size=5"]) == 0
    assert "group_size: 5" in capsys.readouterr().out


@pytest.mark.parametrize("preset", ["drmas_math_qwen3_4b_nonsharing", "drmas_search_qwen25_3b_hetero"])
def test_presets_match_their_env_agents(tmp_path, preset):
    from drmas_train.run.trainer import build_run

    loaded = []

    def loader(spec, model_id):  # stop at the first model load: everything before it is validated
        loaded.append(model_id)
        raise KeyboardInterrupt

    # the paper presets read prepared files (drmas data prepare); stand-in tasks here, as only the agents matter
    stand_in = ["env.data=reasoning_gym:gsm_symbolic"] if "math" in preset else ["env.kwargs.tasks=null"]
    cfg = load_config(preset, [f"run.dir={tmp_path}", "run.tensorboard=false", "eval.every=0", *stand_in])
    with pytest.raises(KeyboardInterrupt):
        build_run(cfg, loader=loader)
    assert loaded == [cfg.agents[next(iter(cfg.agents))]]


def test_group_size_rule_follows_the_estimator():
    """One rule per estimator (issue 40): a group statistic as baseline needs 2 rollouts per task; no groups, a critic
    or a greedy baseline need 1; the config check accepts exactly those."""
    from drmas_train.algorithm.advantages import ESTIMATORS
    from drmas_train.run.config import ConfigError, load_config, min_group_size, validate_config

    singles = {e for e in ESTIMATORS if min_group_size(e) == 1}
    assert singles == {"reinforce_pp", "gae", "remax"}
    for estimator in ("gae", "remax", "reinforce_pp"):
        validate_config(load_config("quickstart_math", [f"algorithm.estimator={estimator}", "rollout.group_size=1"]))
    for size in (0, 1):
        with pytest.raises(ConfigError, match=r"^rollout.group_size must be >= 2 for algorithm.estimator='grpo', got "):
            validate_config(load_config("quickstart_math", ["algorithm.estimator=grpo", f"rollout.group_size={size}"]))
