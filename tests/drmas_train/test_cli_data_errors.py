"""Every command that reads a task file (train, eval, crossplay, play) reports a bad one in one line on stderr
and exits 2, before any model loads; the Dr. MAS reference's own verl rows load in each."""

from __future__ import annotations

import json

import pytest

from drmas_train.cli import main as cli_main

BAD_ROW = {"foo": 1}
# before: "...fields ['foo']; pass format=...": no command has a format option, and no format fits such a row
FORMAT_MESSAGE = ("bad.jsonl:1: cannot infer the data format from fields ['foo']: each row needs the required fields "
                  "of one known format (known formats and their required fields: verl: prompt, reward_model, ")


@pytest.fixture
def no_model_load(monkeypatch):
    import drmas_train.model.models as models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))


@pytest.fixture
def run_dir(tmp_path):
    from drmas_train.run.config import load_config, to_yaml

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(load_config("quickstart_math", [f"run.dir={run}"])))
    return run


def _argv(command, data, tmp_path, run_dir):
    return {
        "train": ["train", f"run.dir={tmp_path / 'train'}", f"env.data={data}", "env.data_options={}"],
        "eval": ["eval", "--env", "math-solver-verifier-v0", "--data", str(data), "--out", str(tmp_path / "eval"),
                 "--no-progress"],
        "crossplay": ["crossplay", "--run", str(run_dir), "--iterations", "0", "--data", str(data), "--k", "1",
                      "--out", str(tmp_path / "crossplay"), "--no-progress"],
        "play": ["play", "--env", "math-solver-verifier-v0", "--data", str(data)],
    }[command]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "prefix"),
    [
        ("train", "drmas train: env.data="),
        ("eval", "drmas eval: --data "),
        ("crossplay", "drmas crossplay: --data "),
        ("play", "drmas play: "),
    ],
)
def test_a_bad_data_file_is_one_line_and_exit_2(tmp_path, capsys, no_model_load, run_dir, command, prefix):
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps(BAD_ROW) + "\n")
    assert cli_main(_argv(command, data, tmp_path, run_dir)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.endswith("\n")
    line = err.splitlines()[-1]
    assert line.startswith(prefix) and FORMAT_MESSAGE in line, err
    assert len([x for x in err.splitlines() if x.startswith("drmas ")]) == 1, err


def test_the_references_math_rows_play_in_eval_and_play(tmp_path, capsys):
    """A row as langfengQ/DrMAS examples/data_preprocess/drmas_math.py:80-97 writes it is scored (oracle: 100 %)."""
    question = "What is $1+1$?"
    row = {"data_source": "math500", "ability": "math", "reward_model": {"style": "rule", "ground_truth": "2"},
           "prompt": [{"role": "user", "content": question}],
           "extra_info": {"split": "test", "index": 0, "answer": "2", "question": question},
           "env_kwargs": {"ground_truth": "2", "question": question, "data_source": "math500"}}  # fmt: skip
    data = tmp_path / "test.jsonl"
    data.write_text(json.dumps(row) + "\n")
    argv = ["eval", "--env", "math-solver-verifier-v0", "--policy", "oracle", "--data", str(data), "--k", "1",
            "--out", str(tmp_path / "eval"), "--no-progress"]  # fmt: skip
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert "math-solver-verifier-v0            math500                1    100.0%    100.0%" in out
    assert cli_main(["play", "--env", "math-solver-verifier-v0", "--data", str(data)]) == 0
    assert capsys.readouterr().out.startswith(f"# task math500-0 [math500]\n{question}\n")
