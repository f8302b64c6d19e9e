"""``drmas play``: every subcommand listed by ``drmas --help`` exists; one episode's transcript for scripted,
human (stdin) and LLM policies; user mistakes exit 2 with one message."""

from __future__ import annotations

import importlib
import io
import re

import pytest

from drmas_train.cli import SUBCOMMANDS
from drmas_train.cli import main as cli_main


def test_every_listed_subcommand_has_a_module_with_main(capsys):
    assert cli_main(["--help"]) == 0
    listed = capsys.readouterr().out
    for name, (module, _) in SUBCOMMANDS.items():
        assert f"  {name}" in listed
        assert callable(importlib.import_module(module).main), module


def test_oracle_episode_transcript(capsys):
    assert cli_main(["play", "--env", "math-solver-verifier-v0", "--policy", "oracle", "--task-index", "3"]) == 0
    out = capsys.readouterr().out
    import drmas_envs

    env = drmas_envs.make("math-solver-verifier-v0")
    env.reset(seed=0, options={"task_index": 3})
    task = env.unwrapped.task
    assert out.startswith(f"# task {task.task_id} [{task.data_source}]\n{task.question}\n")
    turns = re.findall(r"^--- turn (\d+) · (\w+) ---$", out, flags=re.M)
    assert turns == [("0", "solver"), ("1", "verifier")]
    assert f"\\boxed{{{task.answer}}}" in out
    assert out.rstrip().endswith("=== episode over: score 1, won True, returns {'solver': 1.0, 'verifier': 1.0} ===")


def test_human_plays_from_stdin_and_sees_prompts(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("my answer is \\boxed{-1}\n\n<verify>approve</verify>\n\n"))
    assert cli_main(["play", "--env", "math-solver-verifier-v0", "--policy", "human"]) == 0
    out = capsys.readouterr().out
    assert "--- prompt of solver ---" in out and "[solver] your action (end with an empty line):" in out
    assert "--- turn 0 · solver ---\nmy answer is \\boxed{-1}\n" in out
    assert "--- turn 1 · verifier ---\n<verify>approve</verify>\n" in out
    assert "=== episode over: score 0, won False" in out


@pytest.mark.slow  # ~20 s on a loaded 2-core machine (imports transformers, loads the model)
def test_llm_policy_plays_a_tiny_model(capsys):
    argv = ["play", "--env", "math-solver-v0", "--policy", "llm", "--model", "tiny-llama", "--max-new-tokens", "6"]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    # random weights: no \boxed{}, and the reply runs to the 6-token limit (no EOS drawn): marked as cut
    assert "--- turn 0 · solver  [invalid action]  [truncated at the token limit] ---" in out
    assert ("=== episode over: score 0, won False, returns {'solver': -0.1}, 1 of 1 replies truncated at the token "
            "limit ===") in out  # fmt: skip


def test_a_reply_cut_at_the_length_limit_is_marked_and_counted():
    """play_episode marks a Reply with truncated=True on its turn's header and counts it on the last line."""
    import drmas_envs
    from drmas_train.commands.play import Reply, play_episode

    replies = iter([Reply("The answer is \\boxed{1", truncated=True), Reply("<verify>approve</verify>")])
    actors = {a: (lambda env, agent, obs: next(replies)) for a in ("solver", "verifier")}
    out = io.StringIO()
    final = play_episode(drmas_envs.make("math-solver-verifier-v0"), actors, seed=0, task_index=0, out=out)
    text = out.getvalue()
    assert re.findall(r"^--- turn \d+ · .* ---$", text, flags=re.M) == [
        "--- turn 0 · solver  [invalid action]  [truncated at the token limit] ---", "--- turn 1 · verifier ---"]
    assert final["truncated_replies"] == 1
    assert text.rstrip().endswith(", 1 of 2 replies truncated at the token limit ===")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--env", "math-solver-verifer-v0"], r"^drmas play: no env named 'math-solver-verifer' is registered\. "
                                              r"Did you mean: math-solver-verifier-v0"),
        (["--env", "math-solver-v0", "--policy", "llm"], r"^drmas play: policy llm needs --model"),
        (["--env", "math-solver-v0", "--agent-policy", "judge=oracle"], r"^drmas play: --agent-policy names "
                                                                        r"\['judge'\], not agents of math-solver-v0"),
        (["--env", "math-solver-v0", "--agent-policy", "solver=genius"], r"^drmas play: --agent-policy 'solver=genius' "
                                                                         r"must be AGENT=POLICY"),
        (["--env", "math-solver-v0", "--policy", "no-search"], r"^drmas play: baseline 'no-search' is for search envs"),
        (["--env", "math-solver-v0", "--data", "/no/such.jsonl"], r"^drmas play: task file '/no/such.jsonl' not found"),
    ],
)  # fmt: skip
def test_mistakes_exit_2_with_one_message(capsys, argv, message):
    assert cli_main(["play", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err), err


@pytest.mark.parametrize("command", ["play", "eval"])
def test_an_unknown_env_points_at_the_command_that_lists_them(tmp_path, capsys, command):
    """Before: "... See drmas_envs.pprint_registry() for every id." (a Python call, from the command line)."""
    argv = [command, "--env", "nosuch-v0"] + (["--out", str(tmp_path / "out")] if command == "eval" else [])
    assert cli_main(argv) == 2
    err = capsys.readouterr().err  # the closest id suggested depends on which envs other tests registered
    assert re.fullmatch(rf"drmas {command}: no env named 'nosuch' is registered\. Did you mean: [\w/., -]+\? Every id: "
                        r"`drmas envs` \(or drmas_envs\.pprint_registry\(\)\)\.\n", err), err
