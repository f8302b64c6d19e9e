"""Paper presets follow the reference scripts (langfengQ/DrMAS examples/drmas_trainer/run_math.sh, run_search.sh)."""

from __future__ import annotations

import inspect
import json

import pytest
import yaml

from drmas_train.commands.train import main as train_main
from drmas_train.run.config import ConfigError, list_presets, load_config

MATH = [n for n in list_presets() if n.startswith(("drmas_math", "grpo_math"))]
SEARCH = [n for n in list_presets() if n.startswith(("drmas_search", "grpo_search"))]


def _printed(capsys, preset):
    assert train_main(["--print-config", "--config", preset]) == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_print_config_math_qwen3_thinking_off_middle_truncation_reference_eval(capsys):
    cfg = _printed(capsys, "drmas_math_qwen3_4b")
    assert cfg["models"]["shared"]["name_or_path"] == "Qwen/Qwen3-4B"
    assert cfg["models"]["shared"]["chat_template_kwargs"] == {"enable_thinking": False}  # run_math.sh:52
    assert (cfg["rollout"]["max_prompt_tokens"], cfg["rollout"]["truncation"]) == (8192, "middle")  # run_math.sh:49,53
    assert cfg["rollout"]["max_new_tokens"] == 4096
    e = cfg["eval"]
    assert (e["k"], e["temperature"], e["top_p"]) == (16, 0.6, 0.95)  # run_math.sh:11,76-77
    assert (cfg["env"]["data"], e["data"]) == ("data/drmas_math/train.jsonl", "data/drmas_math/test_sampled.jsonl")


def test_print_config_search_reference_eval_k16(capsys):
    cfg = _printed(capsys, "drmas_search_qwen25_3b")
    e = cfg["eval"]
    assert (e["k"], e["temperature"], e["top_p"]) == (16, 0.6, 0.95)  # run_search.sh:11,74-75
    assert (cfg["rollout"]["max_prompt_tokens"], cfg["rollout"]["truncation"]) == (4096, "left")  # run_search.sh:49,52
    assert cfg["models"]["shared"]["name_or_path"] == "Qwen/Qwen2.5-3B"  # base model, as run_search.sh:29
    kw = cfg["env"]["kwargs"]
    assert kw["tasks"] == "data/drmas_search/train.jsonl" and e["data"] == "data/drmas_search/test_sampled.jsonl"
    assert (kw["retriever"], kw["retriever_kwargs"]["url"]) == ("http", "http://127.0.0.1:8000/retrieve")  # run_search.sh:81


@pytest.mark.parametrize("name", MATH + SEARCH)
def test_every_paper_preset_uses_reference_sampling_and_data(name):
    cfg = load_config(name)
    assert (cfg.eval.k, cfg.eval.temperature, cfg.eval.top_p) == (16, 0.6, 0.95)
    assert cfg.algorithm.recompute_old_logprobs
    if name in MATH:
        assert all(m.chat_template_kwargs == {"enable_thinking": False} for m in cfg.models.values())
        assert all(m.name_or_path.startswith("Qwen/Qwen3-") for m in cfg.models.values())
        assert (cfg.rollout.max_prompt_tokens, cfg.rollout.truncation) == (8192, "middle")
        assert cfg.env.data == "data/drmas_math/train.jsonl"
    else:
        assert cfg.env.kwargs["tasks"] == "data/drmas_search/train.jsonl"
        assert not any(m.name_or_path.startswith("Qwen/Qwen2.5-") and "Instruct" in m.name_or_path for m in cfg.models.values())


@pytest.mark.parametrize("name", MATH + SEARCH + ["quickstart_math", "quickstart_math_grpo", "quickstart_search"])
def test_presets_grade_and_retrieve_as_the_reference(name):
    """Paper math presets use the reference's reward (math_reward.py) and search presets a retriever that speaks
    the reference server's protocol (retrieval_server.py:304-307) with the reference's budget; the quickstart math
    presets choose math-verify (their preset says why)."""
    import drmas_envs
    from drmas_envs.math.grading import MathGrader
    from drmas_envs.math.reference_grading import ReferenceGrader
    from drmas_envs.search.retrievers.http import HTTPRetriever

    cfg = load_config(name)
    kwargs = dict(cfg.env.kwargs)
    if "math" in name:
        env = drmas_envs.make(cfg.env.id, data=cfg.env.data if name.startswith("quickstart") else None, **kwargs)
        expected = MathGrader if name.startswith("quickstart") else ReferenceGrader
        assert type(env.unwrapped.grader) is expected
    elif name in SEARCH:
        retriever = HTTPRetriever(**kwargs["retriever_kwargs"])
        assert (retriever.protocol, retriever.timeout, retriever.max_retries) == ("auto", 60.0, 9)
        spec = drmas_envs.spec(cfg.env.id)
        defaults = {k: v.default for k, v in inspect.signature(spec.load()).parameters.items()}
        assert (defaults["termination"], defaults["retrieval_failure"]) == ("reference", "observation")
        assert not {"termination", "retrieval_failure"} & set(kwargs)


def test_search_hetero_is_the_reference_mix():
    cfg = load_config("drmas_search_qwen25_3b_hetero")  # README "Compute Requirements": 2 x Llama-3.2-3B + 1 x Qwen2.5-7B
    per_agent = sorted(cfg.models[k].name_or_path for k in cfg.agents.values())
    assert per_agent == ["Qwen/Qwen2.5-7B", "meta-llama/Llama-3.2-3B-Instruct", "meta-llama/Llama-3.2-3B-Instruct"]


def test_eval_sampling_is_independent_of_training(monkeypatch, tmp_path):
    import drmas_train.collect.rollout as rollout_module
    import drmas_train.run.trainer as trainer
    from helpers.tiny_rl import tiny_config, tiny_loader

    seen = []

    original = rollout_module.rollout

    def spy(env_fn, tasks, group_size, pool, sampling, **kwargs):
        seen.append(sampling)
        return original(env_fn, tasks, group_size, pool, sampling, **kwargs)

    monkeypatch.setattr(rollout_module, "rollout", spy)
    cfg = tiny_config(tmp_path / "r", "run.iterations=1", "rollout.top_p=0.9", "eval.every=1", "eval.k=2", "eval.size=2",
                      "eval.temperature=0.6", "eval.top_p=0.95")  # fmt: skip
    trainer.train(cfg, loader=tiny_loader)
    train_s, eval_s = seen
    assert (train_s.temperature, train_s.top_p) == (1.0, 0.9)
    assert (eval_s.temperature, eval_s.top_p) == (0.6, 0.95)


def test_eval_top_p_is_validated():
    with pytest.raises(ConfigError, match=r"eval.top_p must be in \(0, 1\], got 1.5"):
        load_config("quickstart_math", ["eval.top_p=1.5"])


def test_missing_prepared_data_names_the_prepare_command(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no data/ here
    from drmas_train.run.trainer import build_run

    def loader(*_):
        raise AssertionError("a model was loaded")

    with pytest.raises(ConfigError, match=r"env.data='data/drmas_math/train.jsonl': task file 'data/drmas_math/train.jsonl' not found; it is written by: "
                                          r"drmas data prepare drmas_math --out data/drmas_math"):  # fmt: skip
        build_run(load_config("drmas_math_qwen3_4b", [f"run.dir={tmp_path / 'run'}"]), loader=loader)
    assert train_main(["--config", "drmas_search_qwen25_3b", f"run.dir={tmp_path / 'run2'}"]) == 2  # no traceback
    assert capsys.readouterr().err == (
        "drmas train: env.kwargs.tasks='data/drmas_search/train.jsonl': task file 'data/drmas_search/train.jsonl' not found; it is written by: "
        "drmas data prepare drmas_search --out data/drmas_search (see: drmas data list)\n"
    )


@pytest.mark.slow
def test_search_stand_in_runs_without_downloads(tmp_path):
    """quickstart_search needs no prepared files or server: one iteration with a tiny model in place of SmolLM2."""
    from drmas_train.run.metrics_log import read_metrics
    from drmas_train.run.trainer import train

    cfg = load_config("quickstart_search", [f"run.dir={tmp_path / 'r'}", "run.iterations=1", "run.progress=false",
                                            "run.tensorboard=false", "run.plot=false", "rollout.batch_size=2",
                                            "rollout.group_size=2", "rollout.max_new_tokens=8",
                                            "models.shared.name_or_path=tiny-qwen3"])  # fmt: skip
    assert cfg.env.kwargs.get("tasks") is None and cfg.agents == {"verifier": "shared", "search": "shared", "answer": "shared"}
    train(cfg)
    row = read_metrics(tmp_path / "r" / "metrics.jsonl")[-1]
    assert row["iteration"] == 1 and "reward/verifier/mean" in row


def test_eval_before_train_logs_iteration_zero(tmp_path):
    from drmas_train.run.metrics_log import read_metrics
    from drmas_train.run.trainer import train
    from helpers.tiny_rl import tiny_config, tiny_loader

    cfg = tiny_config(tmp_path / "r", "run.iterations=1", "eval.every=1", "eval.k=2", "eval.size=2", "eval.before_train=true")
    train(cfg, loader=tiny_loader)
    rows = read_metrics(tmp_path / "r" / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [0, 1]
    assert set(rows[0]) == {"iteration", "val/avg@2", "val/avg@2_stderr", "val/pass@2"} and "val/avg@2" in rows[1]
    # per-task scores are kept, and the gain over iteration 0 is their paired mean difference with its stderr
    before, after = ((json.loads((tmp_path / "r" / "validation" / f"iter_{i:06d}.json").read_text())["scores"]) for i in (0, 1))
    diffs = [after[t] - before[t] for t in before]
    assert len(diffs) == 2 and rows[0]["val/avg@2"] == pytest.approx(sum(before.values()) / 2)
    assert rows[1]["val/avg@2_gain"] == pytest.approx(sum(diffs) / 2)
    assert rows[1]["val/avg@2_gain_stderr"] == pytest.approx(abs(diffs[0] - diffs[1]) / 2)  # sd(ddof=1)/sqrt(2)
    assert load_config("drmas_math_qwen3_4b").eval.before_train and load_config("grpo_search_qwen25_7b").eval.before_train
