"""``drmas eval`` as a user types it: count flags refused by the flag's own name, and the console table's columns
aligned for long data-source names."""

from __future__ import annotations

import pytest

from drmas_train.cli import main as cli_main


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
