"""benchmarks/perf/rank_memory.py: its samples have the quickstart iteration's shape, bad arguments exit 2, and one
tiny run reports every phase of every rank (keys and counts only: memory figures depend on the machine)."""

from __future__ import annotations

import json

import pytest

from helpers.scripts import load_script

bench = load_script("benchmarks/perf/rank_memory.py")


def test_samples_are_shaped_like_a_quickstart_iteration():
    samples = bench.make_samples(vocab=49152, n=32, seed=0)
    assert len(samples) == 32
    assert [s.agent_id for s in samples[:4]] == ["solver", "verifier", "solver", "verifier"]
    assert len({s.uid for s in samples}) == 4  # 4 tasks of 4 rollouts, each with a solver and a verifier turn
    solver = [s for s in samples if s.agent_id == "solver"]
    for uid in {s.uid for s in samples}:  # a group's solver prompt is one prompt
        assert len({tuple(s.prompt_ids) for s in solver if s.uid == uid}) == 1
    assert all(len(s.prompt_ids) == 131 for s in solver)
    assert all(200 <= len(s.prompt_ids) <= 240 for s in samples if s.agent_id == "verifier")
    assert all(4 <= len(s.response_ids) <= 40 and len(s.old_logprobs) == len(s.response_ids) for s in samples)
    assert all(10 <= t < 32000 for s in samples for t in s.prompt_ids + s.response_ids)
    again = bench.make_samples(vocab=49152, n=32, seed=0)
    assert [s.response_ids for s in again] == [s.response_ids for s in samples]  # every rank builds the same


@pytest.mark.parametrize(
    "argv", [["--arms", "single,x"], ["--arms", ","], ["--world", "0"], ["--updates", "0"]]
)
def test_bad_arguments_exit_2(argv, capsys):
    assert bench.main(argv) == 2
    assert "rank_memory: arms must be of single, fsdp2, ddp" in capsys.readouterr().err


@pytest.mark.slow
def test_tiny_run_reports_every_phase_of_every_rank(capsys):
    assert bench.main(["--model", "tiny-llama", "--samples", "8", "--micro-batch-tokens", "64",
                       "--arms", "single,fsdp2"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["fixes"] is True and out["world"] == 2 and sorted(out["arms"]) == ["fsdp2", "single"]
    assert sorted(out["arms"]["single"]) == ["rank0"] and sorted(out["arms"]["fsdp2"]) == ["rank0", "rank1"]
    for arm in out["arms"].values():
        for rank in arm.values():
            assert list(rank["phases"]) == ["setup", "update1", "update2"]
            for row in rank["phases"].values():
                assert 0 < row["rss_mb"] <= row["peak_mb"] + 1.0
