"""``drmas eval`` as a user types it: count flags refused by the flag's own name, the console table's columns
aligned for long data-source names, one set of defaults shared with ``EvalConfig``, and a run's own sampling."""

from __future__ import annotations

import dataclasses

import pytest

from drmas_train.cli import main as cli_main
from drmas_train.collect.config import RolloutConfig
from drmas_train.commands.crossplay import build_parser as crossplay_parser
from drmas_train.commands.eval import build_parser, config_from_args
from drmas_train.commands.play import build_parser as play_parser
from drmas_train.eval.evaluate import EvalConfig

MATH = "math-solver-verifier-v0"
#: the EvalConfig fields that drmas eval's flags set
FLAG_FIELDS = ("k", "temperature", "top_p", "top_k", "max_new_tokens", "max_prompt_tokens", "truncation", "seed",
               "batch_tasks", "backend", "limit")


@pytest.mark.parametrize(
    ("command", "flag", "value", "message"),
    [
        ("eval", "--k", "0", "drmas eval: --k must be >= 1, got 0"),
        ("eval", "--limit", "0", "drmas eval: --limit must be >= 1, got 0"),
        ("eval", "--max-new-tokens", "-5", "drmas eval: --max-new-tokens must be >= 1, got -5"),
        ("eval", "--batch-tasks", "0", "drmas eval: --batch-tasks must be >= 1, got 0"),
        ("crossplay", "--k", "0", "drmas crossplay: --k must be >= 1, got 0"),
    ],
)
def test_a_count_flag_below_one_is_refused_by_its_name(tmp_path, capsys, command, flag, value, message):
    """Before: ``drmas eval: EvalConfig.k must be an int >= 1, got 0`` (a Python class the user never typed)."""
    where = ["--env", "math-solver-verifier-v0"] if command == "eval" else ["--run", str(tmp_path)]
    assert cli_main([command, *where, flag, value, "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == message + "\n"
    assert not (tmp_path / "out").exists()


def test_the_table_keeps_its_columns_for_a_long_data_source(tmp_path, capsys):
    """``reasoning_gym/basic_arithmetic`` (30 characters) no longer pushes its row's numbers out of their columns."""
    argv = ["eval", "--env", "math-solver-verifier-v0", "--policy", "oracle", "--data", "reasoning_gym:basic_arithmetic",
            "--limit", "2", "--k", "1", "--out", str(tmp_path / "eval"), "--no-progress"]  # fmt: skip
    assert cli_main(argv) == 0
    table = capsys.readouterr().out.splitlines()[:3]
    assert table == [
        "env                                data_source                    tasks     avg@1    pass@1",
        "math-solver-verifier-v0            reasoning_gym/basic_arithmetic     2    100.0%    100.0%",
        "math-solver-verifier-v0            overall                            2    100.0%    100.0%",
    ]


def test_a_refused_preset_evaluation_leaves_out_as_it_found_it(tmp_path, capsys):
    """``--preset`` writes the run's validation tasks into ``--out`` before ``--team`` is resolved; a refusal after
    that removes them (and the ``--out`` it created), so a refused command writes nothing."""
    from drmas_train.run.config import load_config, to_yaml

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(load_config("quickstart_math", [f"run.dir={run}"])))
    out = tmp_path / "out"
    argv = ["eval", "--preset", str(run / "config.yaml"), "--team", f"solver={run / 'checkpoints' / 'iter_000004'}",
            "--out", str(out), "--no-progress"]  # fmt: skip
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"drmas eval: checkpoint {run / 'checkpoints' / 'iter_000004'} does not exist") and err.count("\n") == 1
    assert not out.exists()
    out.mkdir()  # an --out that existed keeps what it held, and gets nothing
    (out / "notes.txt").write_text("mine")
    assert cli_main(argv) == 2
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_python_and_the_cli_share_one_default(capsys):
    """Before: ``EvalConfig(...).max_new_tokens`` was 1024 (an episode took 48 s) while ``drmas eval`` used 256. Now
    both are 256, rollout.max_new_tokens's default, written once in EvalConfig; every flag's default is the field's."""
    python = EvalConfig(envs=[MATH])
    cli = config_from_args(build_parser().parse_args(["--env", MATH, "--out", "o"]))
    assert {n: getattr(cli, n) for n in FLAG_FIELDS} == {n: getattr(python, n) for n in FLAG_FIELDS}
    assert python.max_new_tokens == cli.max_new_tokens == RolloutConfig().max_new_tokens == 256
    with pytest.raises(SystemExit) as stop:
        cli_main(["eval", "--help"])
    assert stop.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "(4096 for the paper's math presets, 800 for search), else 256 (rollout.max_new_tokens's default" in text
    assert "default: the preset's eval.temperature, else 0.6 (the reference's)" in text
    assert "default: the preset's eval.top_k, else -1" in text
    assert "samples per task (avg@k, pass@k); default: the preset's eval.k, else 16" in text
    assert "(policy llm) (default: 8)" in text
    assert "default: the run's eval.k" in " ".join(crossplay_parser().format_help().split())
    play = play_parser().parse_args(["--env", MATH])  # drmas play samples with the same defaults
    assert (play.temperature, play.max_new_tokens, play.backend) == (python.temperature, python.max_new_tokens,
                                                                     python.backend)  # fmt: skip


def test_eval_of_a_run_config_uses_its_generation_length_and_sampling(tmp_path):
    """``drmas eval --preset runs/<run>/config.yaml`` samples as the run validated: rollout.max_new_tokens,
    eval.temperature, eval.top_p and eval.top_k (before: top_k was the flag's -1 whatever the run's); flags win."""
    from drmas_train.run.config import load_config, to_yaml

    cfg = load_config("quickstart_math", ["rollout.max_new_tokens=48", "eval.temperature=0.3", "eval.top_p=0.8",
                                          "eval.top_k=5", "rollout.max_prompt_tokens=512", "eval.k=3"])  # fmt: skip
    path = tmp_path / "config.yaml"
    path.write_text(to_yaml(cfg))

    def config(*argv):
        return config_from_args(build_parser().parse_args(["--preset", str(path), *argv, "--out", "o"]))

    got = dataclasses.asdict(config())
    assert {n: got[n] for n in ("max_new_tokens", "temperature", "top_p", "top_k", "max_prompt_tokens", "k")} == {
        "max_new_tokens": 48, "temperature": 0.3, "top_p": 0.8, "top_k": 5, "max_prompt_tokens": 512, "k": 3}
    c = config("--top-k", "-1", "--max-new-tokens", "16", "--temperature", "0", "--k", "2")
    assert (c.top_k, c.max_new_tokens, c.temperature, c.top_p, c.k) == (-1, 16, 0.0, 0.8, 2)
