"""The run as a user lives it: each CLI mistake exits 2 with one message (before any model loads), a run directory
holding an earlier run is never truncated, checkpoint temp folders are cleaned, Ctrl-C saves and says where,
resume says from which iteration."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

from drmas_train.collect.task_sampler import TaskSampler
from drmas_train.commands.train import main as train_main
from drmas_train.run.checkpoint import latest_checkpoint
from drmas_train.run.config import ConfigError, load_config, presets_for_env
from drmas_train.run.metrics_log import read_metrics
from drmas_train.run.trainer import build_run, train
from helpers.tiny_rl import tiny_config, tiny_loader


@pytest.fixture
def no_model_load(monkeypatch):
    import drmas_train.model.models as models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["env.data=/no/such/file.jsonl"], r"^drmas train: env.data='/no/such/file.jsonl': task file '/no/such/file.jsonl' "
                                           r"not found\. Accepted: a JSONL/JSON/Parquet file path, 'reasoning_gym:<dataset>'"),
        (["env.id=math-solver-verifer-v0"], r"^drmas train: env.id='math-solver-verifer-v0': no env named "
                                            r"'math-solver-verifer' is registered\. Did you mean: math-solver-verifier-v0"),
        (["env.data=reasoning_gym:no_such_set"], r"^drmas train: env.data='reasoning_gym:no_such_set': unknown "
                                                 r"reasoning-gym dataset 'no_such_set'"),
        (["env.id=search-orchestrator-v0"], r"^drmas train: env.id='search-orchestrator-v0' does not take "
                                            r"env.kwargs.max_loops, env.kwargs.grader, env.data .*it takes: .*corpus, .*"
                                            r"Start from a preset written for 'search-orchestrator-v0': --config quickstart_search"),
        (["eval.every=1", "eval.data=/no/such.jsonl"], r"^drmas train: eval.data='/no/such.jsonl': task file "
                                                         r"'/no/such.jsonl' not found\. Accepted:"),
        (["rollout.group_size=1"], r"^drmas train: rollout.group_size must be >= 2 for algorithm.estimator='drmas', "
                                   r"got 1 \(its baseline is a statistic of the task's group of rollouts"),
        (["rollout.group_size=0"], r"^drmas train: rollout.group_size must be >= 2 for algorithm.estimator='drmas', "
                                   r"got 0 \(its baseline is a statistic of the task's group of rollouts"),
        (["rollout.group_size=0", "algorithm.estimator=gae"],
         r"^drmas train: rollout.group_size must be >= 1 for algorithm.estimator='gae', got 0 \(every task needs a "
         r"rollout\); accepted: 1 or more$"),
        (["--resume"], r"^drmas train: --resume: no checkpoint under .*checkpoints; run without --resume first"),
        (["--resume", "--overwrite"], r"^drmas train: --resume and --overwrite exclude each other"),
    ],
)  # fmt: skip
@pytest.mark.slow
def test_cli_mistake_exits_2_with_one_message(tmp_path, capsys, no_model_load, overrides, message):
    import re

    assert train_main([f"run.dir={tmp_path / 'run'}", *overrides]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err  # one line, no traceback
    assert re.search(message, err), err


@pytest.mark.parametrize(
    ("error", "code"),
    [
        ("RetrieverError", 2),  # a server that refuses the protocol drmas was told to speak: a setting to change
        ("RetrieverUnavailableError", 1),  # unreachable within the budget (retrieval_failure: raise)
    ],
)
def test_a_retrieval_failure_is_one_line_not_a_traceback(tmp_path, capsys, monkeypatch, error, code):
    import drmas_envs.search.retrievers as retrievers
    import drmas_train.run.trainer as trainer

    def fail(*args, **kwargs):
        raise getattr(retrievers, error)("http://127.0.0.1:9/retrieve does not take the body protocol='drmas' sends")

    monkeypatch.setattr(trainer, "train", fail)
    assert train_main([f"run.dir={tmp_path / 'run'}"]) == code
    err = capsys.readouterr().err
    assert err == "drmas train: retrieval failed: http://127.0.0.1:9/retrieve does not take the body protocol='drmas' sends\n"


@pytest.mark.slow
def test_presets_per_env():
    assert presets_for_env("search-orchestrator-v0")[0] == "quickstart_search"
    assert presets_for_env("math-solver-verifier-v0")[0] == "quickstart_math"
    cfg = load_config("quickstart_search")
    assert cfg.env.id == "search-orchestrator-v0" and cfg.env.data is None
    assert sorted(cfg.agents) == ["answer", "search", "verifier"]


def test_quickstart_search_validates_against_its_env(tmp_path):
    loaded = []

    def loader(spec, model_id):  # stop at the first model load: everything before it is validated
        loaded.append(model_id)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_run(load_config("quickstart_search", [f"run.dir={tmp_path}"]), loader=loader)
    assert loaded == ["shared"]


def test_finished_run_dir_is_refused_then_overwritten(tmp_path):
    run_dir = tmp_path / "run"
    train(tiny_config(run_dir, "run.iterations=1"), loader=tiny_loader)
    before = (run_dir / "metrics.jsonl").read_text()
    assert before and latest_checkpoint(run_dir / "checkpoints").name == "iter_000001"

    def loader(*_):
        raise AssertionError("a model was loaded")

    # finished (its checkpoint reached run.iterations): --resume alone would have nothing to do, so the hint says more
    with pytest.raises(ConfigError, match=r"run.dir '.*run' already holds a finished run \(checkpoint iter_000001, "
                                          r"run.iterations=1\); refusing to overwrite it\. Continue it with --resume "
                                          r"and run.iterations above 1"):  # fmt: skip
        train(tiny_config(run_dir, "run.iterations=1"), loader=loader)
    assert (run_dir / "metrics.jsonl").read_text() == before  # untouched
    train(tiny_config(run_dir, "run.iterations=2"), loader=tiny_loader, overwrite=True)
    assert [r["iteration"] for r in read_metrics(run_dir / "metrics.jsonl")] == [1, 2]


def test_partial_checkpoint_folders_are_removed_on_start(tmp_path, caplog):
    # a run that completed no iteration: its leftovers (the interrupted checkpoint write, its config) go whole
    run_dir = tmp_path / "run"
    leftover = run_dir / "checkpoints" / ".tmp-iter_000003-abcd"
    (leftover / "models").mkdir(parents=True)
    (leftover / "models" / "half.safetensors").write_bytes(b"\0" * 10)
    (run_dir / "config.yaml").write_text("stale_marker: 1\n")
    with caplog.at_level(logging.INFO, logger="drmas_train"):
        build_run(tiny_config(run_dir, "run.iterations=1"), loader=tiny_loader)
    assert not (run_dir / "checkpoints").exists() and "stale_marker" not in (run_dir / "config.yaml").read_text()
    assert any("completed no iteration: deleted checkpoints, config.yaml" in r.getMessage() for r in caplog.records)
    # --resume keeps the run and removes only the interrupted write
    train(tiny_config(run_dir, "run.iterations=1"), loader=tiny_loader)
    leftover = run_dir / "checkpoints" / ".tmp-iter_000002-abcd"
    leftover.mkdir()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="drmas_train"):
        build_run(tiny_config(run_dir, "run.iterations=2"), loader=tiny_loader, resume=True)
    assert not leftover.exists() and (run_dir / "checkpoints" / "iter_000001").is_dir()
    assert any(".tmp-iter_000002-abcd (a checkpoint whose write was interrupted)" in r.getMessage() for r in caplog.records)


_CLI = """
import os, signal, sys
import helpers.tiny_rl  # registers the tiny env
import drmas_train.run.trainer as T
from drmas_train.cli import main

# a terminal's Ctrl-C: SIGINT handled by Python and not blocked, whatever this process inherited (an ignored or
# blocked SIGINT survives exec: after some library in the test process ignored or blocked it, the child never saw
# its own SIGINT and ran all 10 iterations)
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGINT}})

def interrupt_at(stage, iteration):
    # Ctrl-C, deterministically: this process sends itself SIGINT when `stage` of `iteration` starts
    name = {{"rollout": "rollout", "update": "_update_models"}}[stage]
    module = __import__("drmas_train.collect.rollout", fromlist=["rollout"]) if stage == "rollout" else T
    real, calls = getattr(module, name), []

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == iteration:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    setattr(module, name, wrapped)

if {stop!r}:
    interrupt_at(*{stop!r})
sys.exit(main(["train", "--config", {config!r}, "models.m.name_or_path=tiny-llama", *{args!r}]))
"""


def _cli(config, *args, stop=None, **popen):
    """``drmas train`` in a subprocess on the tiny env; ``stop=(stage, iteration)`` sends it SIGINT when that
    iteration's ``rollout`` or ``update`` starts (no race with the clock)."""
    code = _CLI.format(config=str(config), args=list(args), stop=stop)
    return subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            **popen)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("stage", "done"), [("update", 3), ("rollout", 2)])
def test_ctrl_c_saves_a_checkpoint_and_resume_says_from_where(tmp_path, stage, done):
    """Ctrl-C during iteration 3's update finishes that iteration and saves it (done = 3); during iteration 3's
    rollout it stops at once and saves iteration 2 (done = 2). Either way the exit code is 130 and --resume goes on."""
    run_dir = tmp_path / "run"
    tiny_config(run_dir)  # writes tmp_path / "run.yaml"
    config = tmp_path / "run.yaml"
    proc = _cli(config, "run.iterations=10", "run.progress=true", stop=(stage, 3))
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, err
    assert len(read_metrics(run_dir / "metrics.jsonl")) == done
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    assert ckpt is not None and ckpt.name == f"iter_{done:06d}"
    assert f"saved checkpoint {ckpt} (iter {done}); continue with --resume" in err
    assert err.rstrip().endswith("drmas train: interrupted") and "Traceback" not in err
    # stderr is a pipe: progress is one plain line per update (no carriage returns, no cursor moves), and the last
    # message starts a line of its own
    assert "\r" not in err and "\x1b[" not in err and "\ndrmas train: interrupted" in err
    assert any(line.startswith("train:") and "iter" in line for line in err.splitlines()), err
    assert not list((run_dir / "checkpoints").glob(".tmp-iter_*"))
    # the saved sampler is the one after `done` iterations, not after the draw of the interrupted one
    state = torch.load(ckpt / "trainer_state.pt", weights_only=True)
    expected = TaskSampler(6, 2, seed=0)
    for _ in range(done):
        expected.next_batch()
    assert state["iteration"] == done and state["sampler"] == expected.state_dict()

    proc = _cli(config, "--resume", f"run.iterations={done + 1}")
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert f"resumed from iter {done} (checkpoint {ckpt})" in err and f"iter {done + 1}: reward" in err
    assert [r["iteration"] for r in read_metrics(run_dir / "metrics.jsonl")] == list(range(1, done + 2))
