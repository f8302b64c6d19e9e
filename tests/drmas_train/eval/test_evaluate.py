"""drmas eval: scripted baselines on the real envs, fixed seeds, the CLIs, and LLM agents through the rollout engine."""

from __future__ import annotations

import json
import random

import pytest

from drmas_train.commands import eval as eval_cmd
from drmas_train.commands import leaderboard as lb_cmd
from drmas_train.eval.baselines import BaselineError, get_baseline, random_text
from drmas_train.eval.evaluate import EvalConfig, episode_seed, evaluate
from drmas_train.eval.results import load_run
from helpers.shared_data import shared_file

MATH = "math-solver-verifier-v0"


def _overall(run, env_id=MATH):
    return run.summary["metrics"][env_id]["overall"]


def test_oracle_and_random_on_math_default_tasks(tmp_path):
    oracle = evaluate(EvalConfig(envs=[MATH], limit=3, k=2, policy="oracle"), tmp_path / "o", progress=False)
    o = _overall(oracle)
    assert o["avg@k"]["value"] == 1.0 and o["pass@k"]["2"]["value"] == 1.0
    assert o["agents"]["solver"]["valid_action_rate"] == 1.0 and o["agents"]["verifier"]["valid_action_rate"] == 1.0
    assert oracle.summary["k"] == 2 and oracle.summary["num_episodes"] == 6
    assert {r["data_source"] for r in oracle.episodes} == {"reasoning_gym/gsm_symbolic"}
    assert [(r["task_id"], r["sample_index"]) for r in oracle.episodes][:3] == [
        ("gsm_symbolic-0-0", 0),
        ("gsm_symbolic-0-0", 1),
        ("gsm_symbolic-0-1", 0),
    ]
    rnd = evaluate(EvalConfig(envs=[MATH], limit=3, k=2, policy="random"), tmp_path / "r", progress=False)
    r = _overall(rnd)
    assert r["avg@k"]["value"] == 0.0
    assert r["agents"]["solver"]["valid_action_rate"] == 0.0  # random text never has a \boxed{}
    assert all(row["returns"]["solver"] == pytest.approx(-0.1) for row in rnd.episodes)  # one invalid call each


@pytest.mark.shared_data
def test_oracle_is_perfect_on_real_gsm8k_and_math500(tmp_path):
    data = [str(shared_file("gsm8k_test.jsonl")), str(shared_file("math500_test.jsonl"))]
    run = evaluate(EvalConfig(envs=[MATH], data=data, limit=10, k=1, policy="oracle"), tmp_path / "o", progress=False)
    cells = run.summary["metrics"][MATH]
    assert set(cells) == {"gsm8k", "math500", "overall"}
    assert cells["gsm8k"]["avg@k"]["value"] == 1.0 and cells["math500"]["avg@k"]["value"] == 1.0
    assert cells["overall"]["num_tasks"] == 20


def test_search_baselines(tmp_path):
    envs = ["search-orchestrator-v0", "search-r1-v0"]
    oracle = evaluate(EvalConfig(envs=envs, limit=3, k=1, policy="oracle"), tmp_path / "o", progress=False)
    for env_id in envs:
        o = _overall(oracle, env_id)
        assert (o["avg@k"]["value"], o["em"]["value"], o["f1"]["value"]) == (1.0, 1.0, 1.0)
        assert o["num_searches"]["value"] == 0.0
    ns = evaluate(EvalConfig(envs=envs, limit=3, k=1, policy="no-search"), tmp_path / "n", progress=False)
    o = _overall(ns, "search-orchestrator-v0")
    assert o["em"]["value"] == 0.0 and o["num_searches"]["value"] == 0.0
    assert o["agents"]["verifier"]["valid_action_rate"] == 1.0 and o["agents"]["search"]["valid_action_rate"] is None
    with pytest.raises(BaselineError, match="baseline 'no-search' is for search envs only"):
        evaluate(EvalConfig(envs=[MATH], limit=1, k=1, policy="no-search"), tmp_path / "x", progress=False)


def test_fixed_seeds_reproduce(tmp_path):
    cfg = EvalConfig(envs=[MATH], limit=2, k=3, policy="random", seed=7)
    a = evaluate(cfg, tmp_path / "a", progress=False).episodes
    b = evaluate(cfg, tmp_path / "b", progress=False).episodes
    strip = [{k: v for k, v in r.items() if k not in ("run_id", "wall_time_s")} for r in a]
    assert strip == [{k: v for k, v in r.items() if k not in ("run_id", "wall_time_s")} for r in b]
    assert len({r["seed"] for r in a}) == 6
    assert episode_seed(7, 0, 1, 2) == a[5]["seed"]
    assert episode_seed(7, 0, 1, 2) != episode_seed(8, 0, 1, 2)
    assert random_text(None, "x", random.Random(1)) == random_text(None, "x", random.Random(1))


def test_config_errors():
    with pytest.raises(ValueError, match="EvalConfig.envs is empty"):
        EvalConfig(envs=[])
    with pytest.raises(ValueError, match=r"EvalConfig.k must be an int >= 1, got 0"):
        EvalConfig(envs=[MATH], k=0)
    with pytest.raises(ValueError, match=r"unknown policy 'gpt'; accepted: \['oracle', 'random', 'no-search', 'llm'\]"):
        EvalConfig(envs=[MATH], policy="gpt")
    with pytest.raises(ValueError, match="policy 'llm' needs a model"):
        EvalConfig(envs=[MATH], policy="llm")
    with pytest.raises(ValueError, match="policy 'oracle' is scripted"):
        EvalConfig(envs=[MATH], model="tiny-qwen3")
    with pytest.raises(ValueError, match=r"does not end in '-v<N>'"):
        EvalConfig(envs=["math-solver"])
    with pytest.raises(BaselineError, match=r"unknown baseline 'orcale'; known: \['no-search', 'oracle', 'random'\]"):
        get_baseline("orcale")


def test_cli_eval_and_leaderboard(tmp_path, capsys):
    runs = tmp_path / "runs"
    for policy in ("oracle", "random"):
        argv = ["--env", MATH, "--policy", policy, "--limit", "2", "--k", "2", "--no-progress"]
        assert eval_cmd.main([*argv, "--out", str(runs / policy)]) == 0
    out = capsys.readouterr().out
    assert "reasoning_gym/gsm_symbolic" in out and "100.0%" in out and "wrote" in out
    summary = json.loads((runs / "oracle" / "summary.json").read_text())
    assert summary["config"]["policy"] == "oracle" and len(summary["config_hash"]) == 16
    assert summary["sampling"] == {"temperature": 0.6, "top_p": 0.95, "top_k": -1, "max_new_tokens": 256}
    # an existing run is never overwritten
    assert eval_cmd.main(["--env", MATH, "--limit", "1", "--k", "1", "--no-progress", "--out", str(runs / "oracle")]) == 2
    assert "already holds a run" in capsys.readouterr().err

    assert eval_cmd.main(["--env", "math-solver-verifer-v0", "--k", "1", "--out", str(tmp_path / "typo")]) == 2
    assert "no env named 'math-solver-verifer' is registered" in capsys.readouterr().err

    assert lb_cmd.main([str(runs), "--out", str(tmp_path / "lb")]) == 0  # a parent dir expands to its runs
    md = (tmp_path / "lb" / "leaderboard.md").read_text()
    assert "| 1 | oracle |" in md and "| 2 | random |" in md and "## math-other" in md

    assert eval_cmd.main(["--env", MATH, "--limit", "2", "--k", "1", "--no-progress", "--out", str(runs / "k1")]) == 0
    capsys.readouterr()
    assert lb_cmd.main([str(runs), "--out", str(tmp_path / "lb2")]) == 2
    assert "runs used different k" in capsys.readouterr().err

    summary["schema_version"] = 0
    (runs / "k1" / "summary.json").write_text(json.dumps(summary))
    assert lb_cmd.main([str(runs / "k1"), "--out", str(tmp_path / "lb3")]) == 2
    assert "written with result schema version 0" in capsys.readouterr().err


@pytest.mark.slow
def test_llm_eval_with_per_agent_models(tmp_path):
    import torch

    torch.set_num_threads(1)
    cfg = EvalConfig(
        envs=[MATH],
        limit=2,
        k=2,
        policy="llm",
        model="tiny-qwen3",
        agent_models={"verifier": {"name_or_path": "tiny-qwen3", "seed": 1, "model_id": "tiny-b"}},
        max_new_tokens=6,
        batch_tasks=2,
        transcripts=True,
    )
    run = evaluate(cfg, tmp_path / "llm", progress=False)
    rows = load_run(tmp_path / "llm").episodes
    assert len(rows) == 4 and [r["sample_index"] for r in rows] == [0, 1, 0, 1]
    assert rows[0]["agent_models"] == {"solver": "tiny-qwen3", "verifier": "tiny-b"}  # two separate models
    for r in rows:
        assert all(r["tokens_in"][a] > 0 for a in ("solver",))
        assert sum(r["calls"].values()) == len(r["transcript"]) == r["num_turns"]
        assert all(0 < r["tokens_out"][a] <= 6 * r["calls"][a] for a in r["calls"] if r["calls"][a])
        # each transcript entry says whether its reply was cut at max_new_tokens
        assert [e["truncated"] for e in r["transcript"]] == [f == "length" for f in r["finish_reasons"]]
    assert any(e["truncated"] for r in rows for e in r["transcript"])  # random weights rarely stop within 6 tokens
    o = _overall(run)
    assert o["agents"]["solver"]["tokens_out"] > 0 and run.summary["label"] == "tiny-qwen3, verifier=tiny-b"


def test_make_example_leaderboard_script(tmp_path, monkeypatch):
    import runpy
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "benchmarks" / "make_example_leaderboard.py"
    out = tmp_path / "example"
    monkeypatch.setattr(sys, "argv", [str(script), "--out", str(out), "--limit", "1", "--k", "1"])
    monkeypatch.chdir(tmp_path)  # the script chdirs into --out; monkeypatch restores the cwd
    runpy.run_path(str(script), run_name="__main__")
    md = (out / "leaderboard.md").read_text()
    assert "| 1 | oracle | `math-solver-verifier-v0` | 100.0 | 100.0 |" in md
    assert "| 3 | no-search | `search-r1-v0` | 0.0 | 0.0 |" in md
    assert sorted(p.name for p in (out / "results").iterdir()) == ["no-search", "oracle", "random"]
    assert "/work/" not in (out / "leaderboard.html").read_text()  # run dirs are named relative to the page


def test_openai_backend_config_errors():
    with pytest.raises(ValueError, match="base_url goes with backend 'openai' and only with it"):
        EvalConfig(envs=[MATH], policy="llm", model="m", backend="openai")
    with pytest.raises(ValueError, match="base_url goes with backend 'openai' and only with it"):
        EvalConfig(envs=[MATH], policy="llm", model="m", base_url="http://127.0.0.1:1/v1")
    with pytest.raises(ValueError, match="max_prompt_tokens cannot be used with backend 'openai'"):
        EvalConfig(envs=[MATH], policy="llm", model="m", backend="openai", base_url="http://x/v1", max_prompt_tokens=64)


@pytest.mark.slow
def test_cli_eval_through_an_openai_compatible_server(tmp_path):
    """`drmas eval --backend openai` plays every agent through a real server on 127.0.0.1 (started here)."""
    pytest.importorskip("uvicorn")
    import torch

    from drmas_train.backends.hf import HFBackend
    from drmas_train.serving.openai_server import create_app
    from helpers.backend_fakes import tiny
    from helpers.local_server import LocalServer

    torch.set_num_threads(1)
    with LocalServer(create_app(HFBackend.from_loaded(tiny("tiny-llama")), "tiny-llama")) as url:
        argv = ["--env", MATH, "--policy", "llm", "--model", "tiny-llama", "--backend", "openai", "--base-url", url,
                "--limit", "2", "--k", "2", "--max-new-tokens", "6", "--transcripts", "--no-progress"]
        assert eval_cmd.main([*argv, "--out", str(tmp_path / "served")]) == 0
    rows = load_run(tmp_path / "served").episodes
    assert len(rows) == 4 and sorted(r["task_id"] for r in rows)[0] == sorted(r["task_id"] for r in rows)[1]
    for r in rows:
        assert r["agent_models"] == {"solver": "tiny-llama", "verifier": "tiny-llama"}
        assert sum(r["calls"].values()) == len(r["transcript"]) == r["num_turns"] >= 2


def test_eval_preset_repeats_the_training_runs_settings_and_flags_win():
    """drmas eval --preset: the reference's eval mode reuses its training script (run_math.sh:4-11): the env and its
    arguments, validation sampling, response / prompt limits and Qwen3's thinking switch come from the preset."""
    from drmas_train.commands.eval import build_parser, config_from_args

    def config(*argv):
        return config_from_args(build_parser().parse_args([*argv, "--policy", "llm", "--model", "m", "--out", "o"]))

    c = config("--preset", "drmas_math_qwen3_4b")
    assert (c.envs, c.max_new_tokens, c.max_prompt_tokens, c.truncation) == (("math-solver-verifier-v0",), 4096, 8192, "middle")
    assert (c.temperature, c.top_p, c.chat_template_kwargs) == (0.6, 0.95, {"enable_thinking": False})
    assert c.env_kwargs["max_loops"] == 2
    c = config("--preset", "drmas_math_qwen3_4b", "--max-new-tokens", "64", "--chat-template-kwarg", "enable_thinking=true")
    assert c.max_new_tokens == 64 and c.chat_template_kwargs == {"enable_thinking": True}
    c = config("--env", "math-solver-v0")  # no preset: the reference's sampling, rollout.max_new_tokens's default
    assert (c.temperature, c.top_p, c.max_new_tokens, c.max_prompt_tokens, c.truncation) == (0.6, 0.95, 256, None, "left")
    with pytest.raises(ValueError, match=r"give --env ENV_ID \(or --preset PRESET"):
        config()


def _fake_run(tmp_path):
    """A quickstart_math run directory with a checkpoint's config (no weights): what eval reads of a run."""
    from drmas_train.run.config import load_config, to_yaml

    run = tmp_path / "run"
    cfg = load_config("quickstart_math", [f"run.dir={run}"])
    folder = run / "checkpoints" / "iter_000008" / "models" / "shared"
    folder.mkdir(parents=True)
    for path in (run / "config.yaml", run / "checkpoints" / "iter_000008" / "config.yaml"):
        path.write_text(to_yaml(cfg))
    return run, cfg, folder


def test_eval_preset_of_a_run_scores_its_validation_tasks_with_its_settings(tmp_path, capsys):
    """drmas eval --preset runs/<run>/config.yaml: the run's env.data validation tasks (held out, basic_arithmetic
    for the math quickstart), its rollout.max_new_tokens and eval sampling; not the env's default gsm_symbolic."""
    from drmas_train.run.env_setup import run_validation_tasks

    run, cfg, _ = _fake_run(tmp_path)
    out = tmp_path / "out"
    assert eval_cmd.main(["--preset", str(run / "config.yaml"), "--policy", "oracle", "--k", "1", "--out", str(out),
                          "--no-progress"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert err == (f"drmas eval: tasks: the run's 32 validation tasks, written to {out / 'validation_tasks.jsonl'} "
                   "(--data plays others)\n")  # fmt: skip
    loaded = load_run(out)
    assert {r["data_source"] for r in loaded.episodes} == {"reasoning_gym/basic_arithmetic"}
    assert sorted({r["task_id"] for r in loaded.episodes}) == sorted(t.task_id for t in run_validation_tasks(cfg))
    config = loaded.summary["config"]
    assert (config["max_new_tokens"], config["temperature"], config["top_p"]) == (
        cfg.rollout.max_new_tokens, cfg.eval.temperature, cfg.eval.top_p)


def test_eval_of_a_checkpoint_model_folder_takes_its_runs_settings(tmp_path, capsys):
    """README's drmas eval --env math-solver-verifier-v0 --model runs/<run>/checkpoints/iter_N/models/shared: the
    checkpoint's config.yaml becomes the preset (its validation tasks, sampling, lengths), and says so; --env naming
    another env scores that one, with a plain note that the model trained on another task."""
    run, cfg, folder = _fake_run(tmp_path)

    def settings(*argv):
        args = eval_cmd.build_parser().parse_args([*argv, "--model", str(folder), "--out", str(tmp_path / "o")])
        notes = eval_cmd.run_settings(args)
        return eval_cmd.config_from_args(args), notes

    c, notes = settings("--env", MATH)
    ckpt_config = run / "checkpoints" / "iter_000008" / "config.yaml"
    assert notes[0] == (f"the model is a checkpoint of a run: its config {ckpt_config} is the preset (env {MATH}, its "
                        "validation tasks, sampling and length limits; flags win)")  # fmt: skip
    assert c.data == (str(tmp_path / "o" / "validation_tasks.jsonl"),) and c.policy == "llm"
    assert (c.max_new_tokens, c.temperature) == (cfg.rollout.max_new_tokens, cfg.eval.temperature)
    c, notes = settings("--env", "math-solver-v0")
    assert notes == [f"the model is a checkpoint of the run {ckpt_config.parent} trained on {MATH} (data: "
                     f"reasoning_gym:basic_arithmetic); scoring math-solver-v0 instead, another task (--preset "
                     f"{ckpt_config} scores the run's own)"]  # fmt: skip
    assert c.data == () and c.max_new_tokens == 256


def test_eval_and_crossplay_help_name_only_what_exists():
    """--limit's default is stated; crossplay (no --preset) does not point at --preset."""
    from drmas_train.commands import crossplay as crossplay_cmd

    eval_help = " ".join(eval_cmd.build_parser().format_help().split())
    assert "first N tasks of each source; default: all" in eval_help
    assert "else 256 (rollout.max_new_tokens's default" in eval_help
    cross_help = crossplay_cmd.build_parser().format_help()
    assert "--preset" not in cross_help


def test_chat_template_kwargs_reach_every_local_model():
    from drmas_train.eval.evaluate import _with_template_kwargs

    got = _with_template_kwargs({"*": "tiny-qwen3", "verifier": {"name_or_path": "tiny-qwen3", "seed": 1,
                                                                 "chat_template_kwargs": {"enable_thinking": True}}},
                                {"enable_thinking": False})  # fmt: skip
    assert got == {"*": {"name_or_path": "tiny-qwen3", "chat_template_kwargs": {"enable_thinking": False}},
                   "verifier": {"name_or_path": "tiny-qwen3", "seed": 1, "chat_template_kwargs": {"enable_thinking": True}}}  # fmt: skip
