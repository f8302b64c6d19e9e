"""Held-out validation on procedural data (``drmas_train.run.env_setup``): ``env.data_options``, and validation tasks
that repeat no training question."""

from __future__ import annotations

import logging

import pytest

from drmas_envs.core import Task
from drmas_train.run.config import ConfigError, load_config
from drmas_train.run.env_setup import held_out_tasks, load_env_tasks

ONE_DIGIT = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"],
             "allow_negation": False, "allow_parentheses": False}  # fmt: skip


def _tasks(*questions: str) -> list[Task]:
    return [Task(f"t{i}", "src", q, "0") for i, q in enumerate(questions)]


def test_held_out_keeps_unseen_questions_in_order_up_to_size():
    train = _tasks("a", "b")
    candidates = _tasks("a", "c", "b", "d", "e")
    assert [t.question for t in held_out_tasks(candidates, train, 2)] == ["c", "d"]
    assert [t.question for t in held_out_tasks(candidates, train, 10)] == ["c", "d", "e"]  # fewer when it runs out
    with pytest.raises(ConfigError, match="no held-out validation task: all 2 candidates repeat a question"):
        held_out_tasks(_tasks("a", "b"), train, 3)


def test_data_options_size_the_training_set_and_validation_is_disjoint_from_it():
    cfg = load_config(None, ["env.data=reasoning_gym:basic_arithmetic", f"env.data_options={ONE_DIGIT | {'size': 60}}"])
    train = load_env_tasks(cfg)
    assert len(train) == 60 and train.config == ONE_DIGIT
    candidates = load_env_tasks(cfg, cfg.env.data, seed=cfg.seed + 10_000, size=1000)
    assert len(candidates) == 1000  # the candidates are not sized by the training set's size
    seen = {train[i].question for i in range(len(train))}
    assert sum(candidates[i].question in seen for i in range(len(candidates))) > 100  # a small problem space repeats
    val = held_out_tasks(candidates, train, 32)
    assert len(val) == 32 and not seen & {t.question for t in val}


def test_data_options_apply_to_procedural_specs_only(tmp_path, caplog):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"task_id": "a", "data_source": "s", "question": "q", "answer": "1"}\n')
    cfg = load_config(None, [f"env.data={path}"])  # the quickstart preset's options stay; a file has none
    assert cfg.env.data_options
    with caplog.at_level(logging.WARNING, logger="drmas_train.run.env_setup"):
        tasks = load_env_tasks(cfg)
    assert len(tasks) == 1 and "env.data_options ['allow_negation'" in caplog.text and "has none" in caplog.text
    cfg = load_config(None, ["env.data=reasoning_gym:basic_arithmetic", "env.data_options={digits: 1}"])
    with pytest.raises(ConfigError, match=r"env.data='reasoning_gym:basic_arithmetic': bad options .*its options"):
        load_env_tasks(cfg)


def test_search_env_validation_asks_other_questions_about_the_same_world(tmp_path, caplog):
    """The search envs' own synthetic tasks: validation draws other questions about the same encyclopedia
    (``SearchTextEnv.generated_tasks``, question seed ``seed + 10000``), none of them a training question."""
    from drmas_train.run.trainer import build_run

    cfg = load_config("quickstart_search", [f"run.dir={tmp_path / 'run'}", "models.shared.name_or_path=tiny-llama",
                                            "run.tensorboard=false", "run.plot=false", "run.progress=false",
                                            "run.num_threads=1", "eval.size=24"])  # fmt: skip
    with caplog.at_level(logging.INFO, logger="drmas_train.run.trainer"):
        run = build_run(cfg)
    train = {run.tasks[i].question for i in range(len(run.tasks))}
    val = list(run.val_tasks)
    assert len(val) == 24 and not train & {t.question for t in val}
    assert all(t.task_id.startswith(f"synth-0q{cfg.seed + 10_000}-") for t in val)
    passages = {p.title for p in run.env_fn().unwrapped.retriever.passages}
    assert {t.extra["supporting_titles"][0] for t in val} <= passages  # answerable from the training corpus
    assert {t.extra["type"] for t in val} == {t.extra["type"] for t in run.tasks}  # the same question mix
    assert "validation: 24 held-out tasks of the env's own generator (seed 10000" in caplog.text
