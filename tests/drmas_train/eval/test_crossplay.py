"""Cross-play of a training run's checkpoints (``drmas crossplay``) and per-role checkpoints in ``drmas eval --team``.

A tiny run (tests/helpers/tiny_rl.py: agents ``a`` and ``b`` sharing model ``m``) keeps its checkpoints of iterations 1
and 2; the 2 x 2 grid (a's model at iteration 1 or 2) x (b's at 1 or 2) must label its cells with the checkpoint that
played each role and give, in every cell, exactly what a separate ``drmas eval --preset <run>/config.yaml --team``
of that assignment gives (crossplay takes the run's env and settings as that preset does).
"""

from __future__ import annotations

import json

import pytest

from drmas_train.cli import main as cli_main
from drmas_train.commands import crossplay as crossplay_cmd
from drmas_train.commands import eval as eval_cmd
from drmas_train.run.run_models import RunModelsError, open_run, team_model
from helpers.tiny_rl import tiny_config, tiny_loader

PLAY = ["--k", "2", "--limit", "3", "--batch-tasks", "3", "--temperature", "1.0", "--max-new-tokens", "4",
        "--no-progress"]  # fmt: skip


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from drmas_train.run.trainer import train

    tmp = tmp_path_factory.mktemp("crossplay")
    cfg = tiny_config(
        tmp / "run", "run.iterations=2", "run.save_every=1", "run.keep_checkpoints=2", "run.name=tinyrun"
    )
    train(cfg, loader=tiny_loader)
    return tmp / "run"


def _ckpt(run_dir, it):
    return run_dir / "checkpoints" / f"iter_{it:06d}"


@pytest.mark.slow
def test_crossplay_grid_equals_separate_team_evals(run_dir, tmp_path, capsys):
    out = tmp_path / "grid"
    assert crossplay_cmd.main(["--run", str(run_dir), "--iterations", "1,2", *PLAY, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "avg@2 ± SE · tiny-target-token-v0" in printed and "rows: a, columns: b" in printed
    matrix = json.loads((out / "crossplay.json").read_text())
    assert matrix["schema"] == "drmas-crossplay/1" and matrix["roles"] == {"rows": "a", "cols": "b"}
    assert (
        [r["label"] for r in matrix["rows"]] == [c["label"] for c in matrix["cols"]] == ["iter 1", "iter 2"]
    )
    assert matrix["rows"][1]["info"] == {
        "iteration": 2,
        "model": "m",
        "model_of": "a",
        "checkpoint": str(_ckpt(run_dir, 2)),
    }
    assert matrix["envs"] == ["tiny-target-token-v0"] and matrix["k"] == 2
    for i, ri in enumerate((1, 2)):
        for j, cj in enumerate((1, 2)):
            cell = matrix["cells"][i][j]
            assert cell["label"] == f"a=iter {ri}, b=iter {cj}"
            assert cell["agent_models"] == {"a": f"tinyrun/iter_{ri}/m", "b": f"tinyrun/iter_{cj}/m"}
            got = cell["metrics"]["tiny-target-token-v0"]["tiny"]
            separate = tmp_path / f"team_{ri}_{cj}"
            team = f"a={_ckpt(run_dir, ri)},b={_ckpt(run_dir, cj)}"
            argv = ["--preset", str(run_dir / "config.yaml"), "--team", team, *PLAY, "--out", str(separate)]
            assert eval_cmd.main(argv) == 0  # the run's env and settings, as crossplay takes them
            summary = json.loads((separate / "summary.json").read_text())
            cell_summary = json.loads((out / cell["result_dir"] / "summary.json").read_text())
            assert summary["sampling"] == cell_summary["sampling"]
            assert {k: v for k, v in summary["config"].items() if k != "label"} == {
                k: v for k, v in cell_summary["config"].items() if k != "label"
            }
            want = summary["metrics"]["tiny-target-token-v0"]["tiny"]
            assert got["avg@k"] == want["avg@k"] and got["pass@k"] == want["pass@k"]["2"]
            assert got["num_tasks"] == 3 and summary["agent_models"] == cell["agent_models"]
            episodes = [
                json.loads(line)
                for line in (out / cell["result_dir"] / "episodes.jsonl").read_text().splitlines()
            ]
            mine = [json.loads(line) for line in (separate / "episodes.jsonl").read_text().splitlines()]
            assert [(e["task_id"], e["won"], e["reward"]) for e in episodes] == [
                (e["task_id"], e["won"], e["reward"]) for e in mine
            ]
    assert (out / "crossplay_tiny-target-token-v0_tiny.png").stat().st_size > 1000
    assert (out / "leaderboard" / "leaderboard.md").is_file()
    # run again into the same directory: the cells are read back, not played again, and the grid is the same
    before = {p: p.stat().st_mtime_ns for p in (out / "cells").rglob("episodes.jsonl")}
    assert crossplay_cmd.main(["--run", str(run_dir), "--iterations", "1,2", *PLAY, "--out", str(out)]) == 0
    assert json.loads((out / "crossplay.json").read_text())["cells"] == matrix["cells"]
    assert {p: p.stat().st_mtime_ns for p in (out / "cells").rglob("episodes.jsonl")} == before


@pytest.mark.parametrize(("argv", "message"), [
    (["--iterations", "1,3"], r"has no checkpoint of iteration 3 \(it keeps \[1, 2\], and 0 is the initial model\); "
                              r"cross-play over iterations needs each one kept: .*keep_checkpoints=2"),
    (["--roles", "a,c"], r"role 'c' is not an agent of run .*; its agents: \['a', 'b'\]"),
    (["--roles", "a,a"], r"--roles takes two different roles"),
    (["--iterations", "1", "--fixed", "c=1"], r"--fixed names roles \['c'\] that the run does not have"),
    (["--iterations", "1", "--k", "0"], r"^drmas crossplay: --k must be >= 1, got 0$"),
])  # fmt: skip
def test_crossplay_bad_input_exits_2_with_one_line(run_dir, tmp_path, capsys, argv, message):
    assert crossplay_cmd.main(["--run", str(run_dir), *argv, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("drmas crossplay: ") and "\n" not in err and "Traceback" not in err
    assert pytest.importorskip("re").search(message, err), err
    assert not (tmp_path / "x").exists()  # nothing played


def test_crossplay_of_a_directory_that_is_no_run(tmp_path, capsys):
    assert crossplay_cmd.main(["--run", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "is not a drmas run directory (no config.yaml)" in capsys.readouterr().err


def test_team_sources(run_dir):
    latest = team_model(str(run_dir), "b")  # a run directory: its latest checkpoint
    assert latest["name_or_path"] == str(_ckpt(run_dir, 2) / "models" / "m")
    assert latest["model_id"] == "tinyrun/iter_2/m"
    assert team_model(str(_ckpt(run_dir, 1)), "a")["model_id"] == "tinyrun/iter_1/m"
    folder = team_model(
        str(_ckpt(run_dir, 1) / "models" / "m"), "b"
    )  # a model folder: whichever role it played
    assert (
        folder["name_or_path"] == str(_ckpt(run_dir, 1) / "models" / "m")
        and folder["model_id"] == "tinyrun/iter_1/m"
    )
    assert team_model("tiny-llama", "a") == "tiny-llama"  # anything else: a model name or path
    with pytest.raises(RunModelsError, match=r"role 'z' is not an agent"):
        team_model(str(run_dir), "z")


def test_team_flag_errors_exit_2(run_dir, tmp_path, capsys):
    code = eval_cmd.main(
        ["--env", "tiny-target-token-v0", "--team", f"z={run_dir}", "--out", str(tmp_path / "x")]
    )
    assert code == 2 and "role 'z' is not an agent" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        eval_cmd.build_parser().parse_args(["--team", "a", "--out", "x"])


def test_team_names_a_checkpoint_the_run_did_not_keep(run_dir, tmp_path, capsys):
    """Before: "model path '.../iter_000003' is not an existing directory." (read as a model path)."""
    gone = _ckpt(run_dir, 3)
    argv = ["eval", "--env", "tiny-target-token-v0", "--team", f"a={gone}", "--out", str(tmp_path / "x")]
    assert cli_main(argv) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"drmas eval: checkpoint {gone} does not exist: run {run_dir} keeps [1, 2] (run.save_every=1, "
        "run.keep_checkpoints=2); give a kept one, or the run directory for its latest")


def test_swaps_add_the_other_roles_models_of_the_same_base(tmp_path):
    """Non-sharing run (a: m, b: m2, both the tiny model): --swaps lets b's model play a (and a's play b), from
    iteration 1 on (at 0 both are the same base)."""
    from drmas_train.run.trainer import train

    cfg = tiny_config(tmp_path / "run", "run.iterations=1", "models.m2.name_or_path=tiny", "agents.b=m2")
    train(cfg, loader=tiny_loader)
    args = crossplay_cmd.build_parser().parse_args(["--run", str(tmp_path / "run"), "--iterations", "0,1", "--swaps",
                                                     "--out", str(tmp_path / "x")])  # fmt: skip
    run, plan, notes = crossplay_cmd.plan_from_args(args)
    assert [p.label for p in plan.rows] == ["base", "iter 1", "iter 1 (b's model)"]
    assert [p.label for p in plan.cols] == ["base", "iter 1", "iter 1 (a's model)"]
    assert plan.rows[2].model["name_or_path"].endswith("iter_000001/models/m2")
    assert plan.rows[2].info == {
        "iteration": 1,
        "model": "m2",
        "model_of": "b",
        "checkpoint": str(run.checkpoints[1]),
    }
    assert plan.rows[0].model == {"name_or_path": "tiny", "dtype": "float32", "device": "cpu", "seed": 0,
                                  "chat_template_kwargs": {}, "model_id": "run/base/m"} and notes == []  # fmt: skip
    assert open_run(tmp_path / "run").roles == ["a", "b"]


@pytest.mark.slow
def test_crossplay_without_data_plays_the_runs_validation_tasks(tmp_path, capsys):
    """The tiny env validates on its own first eval.size tasks: crossplay plays exactly those."""
    from drmas_train.run.trainer import train

    cfg = tiny_config(tmp_path / "run", "run.iterations=1", "run.save_every=1", "eval.every=1", "eval.size=3",
                      "eval.k=2", "run.name=valrun")  # fmt: skip
    train(cfg, loader=tiny_loader)
    validated = json.loads((tmp_path / "run" / "validation" / "iter_000001.json").read_text())["scores"]
    out = tmp_path / "grid"
    play = [a for i, a in enumerate(PLAY) if "--limit" not in PLAY[max(i - 1, 0) : i + 1]]  # no --limit
    assert crossplay_cmd.main(["--run", str(tmp_path / "run"), "--iterations", "1", *play, "--out", str(out)]) == 0
    assert "tasks: the env's own first 3, as the run validated on its first 3" in capsys.readouterr().err
    cell = json.loads((out / "crossplay.json").read_text())["cells"][0][0]
    played = {json.loads(line)["task_id"] for line in (out / cell["result_dir"] / "episodes.jsonl").read_text().splitlines()}
    assert played == set(validated)


def test_validation_tasks_of_a_procedural_run_are_its_held_out_ones(tmp_path):
    """A run on reasoning_gym data validates on held-out questions from another seed: crossplay writes exactly
    those (rebuilt from the run's config, as the trainer built them) and plays them as --data."""
    import argparse

    from drmas_train.run.config import load_config, to_yaml
    from drmas_train.run.env_setup import held_out_tasks, load_env_tasks

    cfg = load_config("quickstart_math", [f"run.dir={tmp_path / 'run'}"])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(to_yaml(cfg))
    args = argparse.Namespace(run=str(tmp_path / "run"), out=str(tmp_path / "out"), data=[], limit=None)
    note = crossplay_cmd.validation_tasks_of_run(args)
    assert note.startswith("tasks: the run's 32 validation tasks, written to")
    rows = [json.loads(line) for line in (tmp_path / "out" / "validation_tasks.jsonl").read_text().splitlines()]
    train_tasks = load_env_tasks(cfg)
    expected = held_out_tasks(load_env_tasks(cfg, cfg.env.data, key="env.data", seed=10_000, size=1000), train_tasks, 32)
    assert [r["task_id"] for r in rows] == [t.task_id for t in expected]
    assert not {r["question"] for r in rows} & {train_tasks[i].question for i in range(len(train_tasks))}
    assert args.data == [str(tmp_path / "out" / "validation_tasks.jsonl")]


def test_a_run_validated_on_env_generated_questions_plays_them_about_the_same_world(tmp_path):
    """The search quickstart validates on held-out questions its env generates (question seed = seed + 10000):
    crossplay writes exactly those (none a training question) and plays them as --data, with the run's synthetic
    world as their corpus, so a cell's env asks the questions the trainer validated on, about the same passages."""
    import argparse

    import drmas_envs
    from drmas_train.eval.evaluate import _make_env
    from drmas_train.run.config import load_config, to_yaml
    from drmas_train.run.env_setup import run_validation_tasks

    cfg = load_config("quickstart_search", [f"run.dir={tmp_path / 'run'}"])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(to_yaml(cfg))
    args = argparse.Namespace(run=str(tmp_path / "run"), out=str(tmp_path / "out"), data=[], limit=None, env_kwarg=[])
    note = crossplay_cmd.validation_tasks_of_run(args)
    path = tmp_path / "out" / "validation_tasks.jsonl"
    assert note == f"tasks: the run's 16 validation tasks, written to {path} (--data plays others)"
    assert args.data == [str(path)] and args.limit is None
    assert args.env_kwarg == []  # the run's env kwargs name its world (synthetic=...): nothing to add
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    validated = run_validation_tasks(cfg)
    assert [r["task_id"] for r in rows] == [t.task_id for t in validated]
    assert all(r["task_id"].startswith(f"synth-{cfg.seed}q{cfg.seed + 10_000}-") for r in rows)
    train = drmas_envs.make(cfg.env.id, **dict(cfg.env.kwargs)).unwrapped
    assert not {r["question"] for r in rows} & {train.tasks[i].question for i in range(len(train.tasks))}

    from drmas_envs.data import load_tasks

    cell = _make_env(cfg.env.id, load_tasks(str(path)), dict(cfg.env.kwargs)).unwrapped
    assert [cell.tasks[i].question for i in range(len(cell.tasks))] == [r["question"] for r in rows]
    assert cell.tasks[0].answer == tuple(rows[0]["answer"])
    assert [p.text for p in cell.retriever.passages] == [p.text for p in train.retriever.passages]


def test_a_run_on_the_default_synthetic_world_keeps_it_when_its_questions_are_played_from_a_file(tmp_path):
    """A run whose env kwargs name no synthetic world (the env's default one) still validated on generated
    questions: crossplay adds --env-kwarg synthetic={} so the played file's questions keep that world's corpus."""
    import argparse

    from drmas_train.run.config import load_config, to_yaml

    cfg = load_config("quickstart_search", [f"run.dir={tmp_path / 'run'}"])
    cfg.env.kwargs = {k: v for k, v in cfg.env.kwargs.items() if k != "synthetic"}
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(to_yaml(cfg))
    args = argparse.Namespace(run=str(tmp_path / "run"), out=str(tmp_path / "out"), data=[], limit=None, env_kwarg=[])
    crossplay_cmd.validation_tasks_of_run(args)
    assert args.env_kwarg == [("synthetic", "{}")]
    assert len((tmp_path / "out" / "validation_tasks.jsonl").read_text().splitlines()) == cfg.eval.size
