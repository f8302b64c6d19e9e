"""Result schema: write/load round trip, required fields, schema-version refusal, config hash."""

from __future__ import annotations

import json

import pytest

from drmas_train.eval.results import (
    EPISODE_FIELDS,
    SCHEMA_VERSION,
    SUMMARY_FIELDS,
    ResultsError,
    SchemaVersionError,
    config_hash,
    env_version,
    episode_row,
    git_commit,
    load_run,
    write_run,
)
from helpers.eval_rows import make_episodes, make_summary


def test_round_trip(tmp_path):
    rows = make_episodes()
    summary = make_summary(rows, 2)
    write_run(tmp_path / "run", summary, rows)
    run = load_run(tmp_path / "run")
    assert run.episodes == rows
    assert run.summary["schema_version"] == SCHEMA_VERSION
    assert run.summary["metrics"]["toy-v0"]["gsm8k"]["avg@k"]["value"] == pytest.approx(0.5)
    assert set(SUMMARY_FIELDS) <= set(run.summary) and set(EPISODE_FIELDS) <= set(run.episodes[0])
    assert run.label == "oracle"
    with pytest.raises(ResultsError, match="already holds a run"):
        write_run(tmp_path / "run", summary, rows)


def test_older_schema_fails_clearly(tmp_path):
    rows = make_episodes()
    write_run(tmp_path / "old", {**make_summary(rows, 2), "schema_version": 0}, rows)
    with pytest.raises(SchemaVersionError, match=r"written with result schema version 0, but this drmas reads version 1"):
        load_run(tmp_path / "old")
    write_run(tmp_path / "new", {**make_summary(rows, 2), "schema_version": 99}, rows)
    with pytest.raises(SchemaVersionError, match=r"version 99, newer than the version 1 .* upgrade drmas"):
        load_run(tmp_path / "new")
    # an old row inside a current summary is caught too, naming file and line
    write_run(tmp_path / "mixed", make_summary(rows, 2), [rows[0], {**rows[1], "schema_version": 0}])
    with pytest.raises(SchemaVersionError, match=r"episodes.jsonl:2 was written with result schema version 0"):
        load_run(tmp_path / "mixed")


def test_malformed_dirs(tmp_path):
    with pytest.raises(ResultsError, match="does not exist"):
        load_run(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ResultsError, match="not a drmas results directory: summary.json not found"):
        load_run(tmp_path / "empty")
    rows = make_episodes()
    write_run(tmp_path / "r", make_summary(rows, 2), rows)
    (tmp_path / "r" / "episodes.jsonl").write_text('{"schema_version": 1}\nnot json\n')
    with pytest.raises(ResultsError, match=r"episodes.jsonl:1 is missing required field\(s\) \['run_id'"):
        load_run(tmp_path / "r")
    assert load_run(tmp_path / "r", episodes=False).episodes == []
    bad = make_summary(rows, 2)
    del bad["metrics"]
    with pytest.raises(ValueError, match=r"summary is missing required field\(s\) \['metrics'\]"):
        write_run(tmp_path / "s", bad, rows)
    with pytest.raises(ValueError, match=r"episode row is missing required field\(s\) \['run_id'"):
        episode_row(env_id="toy-v0")


def test_config_hash_is_canonical():
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})
    assert len(config_hash({})) == 16


def test_env_version_and_git_commit(tmp_path):
    assert env_version("math-solver-verifier-v0") == 0
    assert env_version("search-r1-v12") == 12
    with pytest.raises(ValueError, match=r"does not end in '-v<N>'"):
        env_version("math-solver")
    assert git_commit(tmp_path) is None  # not a checkout
    commit = git_commit()
    assert commit is None or len(commit.split("-")[0]) == 40


def test_rows_are_strict_json(tmp_path):
    rows = make_episodes()
    rows[0]["reward"] = float("nan")
    with pytest.raises(ValueError, match="Out of range float"):
        write_run(tmp_path / "nan", make_summary(make_episodes(), 2), rows)
    json.loads(json.dumps(make_summary(make_episodes(), 2)))  # summary is plain JSON
