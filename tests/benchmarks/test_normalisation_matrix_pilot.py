"""benchmarks/normalisation_matrix/pilot.py: the game outcome and the choice rule from PROTOCOL.md's definitions on
hand-built runs, the candidates' presets, and the runner end to end on a tiny model (limit and reuse included)."""

from __future__ import annotations

import json
import statistics

import pytest

from helpers.scripts import load_script

pilot = load_script("benchmarks/normalisation_matrix/pilot.py")


def _validation(initial: dict[str, float], final: dict[str, float], last: int = 12) -> dict[str, dict[str, float]]:
    def row(returns: dict[str, float]) -> dict[str, float]:
        out = {f"val/random-v0/{r}/return": v for r, v in returns.items()}
        out["val/random-v0/all/return"] = statistics.fmean(returns.values())
        return out

    return {"0": row(initial), "4": row(initial), str(last): {**row(final), "val/random-v0/return_gain": 0.5,
                                                               "val/random-v0/return_gain_se": 0.1}}


def test_run_outcome_averages_the_roles_gains_with_equal_weight():
    out = pilot.run_outcome(_validation({"player_0": 0.125, "player_1": -0.125}, {"player_0": 0.5, "player_1": 0.25}))
    assert out["role_gain"] == {"player_0": pytest.approx(0.375), "player_1": pytest.approx(0.375)}
    assert out["gain"] == pytest.approx(0.375) and out["final_iteration"] == 12
    assert (out["pooled_gain"], out["pooled_gain_se"]) == (0.5, 0.1)  # the trainer's, reported beside
    out = pilot.run_outcome(_validation({"player_0": 0.0, "player_1": 0.0}, {"player_0": 1.0, "player_1": -0.5}))
    assert out["gain"] == pytest.approx(0.25)  # (1.0 + (-0.5)) / 2: roles weigh equally, not their episodes


def test_run_outcome_errors():
    with pytest.raises(ValueError, match="iteration 0"):
        pilot.run_outcome({"4": {"val/random-v0/player_0/return": 0.1}})
    with pytest.raises(ValueError, match="no role has a return"):
        pilot.run_outcome({"0": {"val/random-v0/all/return": 0.1}, "4": {"val/random-v0/all/return": 0.2}})


def _runs(cand: str, gains: list[float], wall: float = 600.0, status: str = "finished") -> list[dict]:
    return [{"candidate": cand, "status": status, "wall_time_s": wall, "outcome": {"gain": g}} for g in gains]


def test_choose_takes_the_largest_qualifying_mean():
    runs = [*_runs("kuhn_poker", [0.4, 0.5, 0.45, 0.55]),       # mean 0.475, SE 0.032: qualifies
            *_runs("tic_tac_toe", [0.9, -0.1, 0.8, 0.0]),        # mean 0.4, SE 0.26: 0.4 < 2 SE, did not learn
            *_runs("connect_four", [1.0, 1.0, 1.0, 1.0], wall=1300.0)]  # the largest mean, but over 20 minutes
    out = pilot.choose(runs)
    assert out["chosen"] == "kuhn_poker" and out["preset"] == "quickstart_game_kuhn_poker"
    kuhn = out["table"]["kuhn_poker"]
    assert kuhn["mean"] == pytest.approx(0.475) and kuhn["stderr"] == pytest.approx(statistics.stdev([0.4, 0.5, 0.45, 0.55]) / 2)
    assert out["table"]["tic_tac_toe"]["why"] == "did not learn"
    assert out["table"]["connect_four"]["why"] == "too slow" and not out["table"]["connect_four"]["eligible"]
    both = [*_runs("kuhn_poker", [0.1, 0.12, 0.11, 0.13]), *_runs("tic_tac_toe", [0.3, 0.31, 0.32, 0.33])]
    assert pilot.choose(both)["chosen"] == "tic_tac_toe"


def test_choose_drops_the_game_when_none_qualifies():
    runs = [*_runs("kuhn_poker", [0.1, -0.1, 0.1, -0.1]), *_runs("tic_tac_toe", [0.5, 0.5, 0.5]),
            *_runs("connect_four", [0.5], status="over_limit"), {"candidate": "connect_four", "status": "not_run"}]
    out = pilot.choose(runs)
    assert out["chosen"] is None and out["preset"] is None
    assert [out["table"][c]["why"] for c in ("kuhn_poker", "tic_tac_toe", "connect_four")] == [
        "did not learn", "runs missing", "too slow"]
    assert pilot.choose([*_runs("kuhn_poker", [0.5, 0.5, 0.5]), *_runs("kuhn_poker", [0.5], status="failed")])[
        "table"]["kuhn_poker"]["why"] == "a run failed"


def test_jobs_are_seeds_times_cells_and_the_presets_are_built_alike(tmp_path):
    from drmas_train.run.config import load_config

    jobs = pilot.pilot_jobs(list(pilot.CANDIDATES), tmp_path)
    assert len(jobs) == 12 and len({j["run_dir"] for j in jobs}) == 12
    assert [(j["seed"], j["cell"]) for j in jobs[:4]] == [(0, "G-T"), (0, "A-C"), (1, "G-T"), (1, "A-C")]
    quick = load_config("quickstart_math")
    for job in jobs:
        cfg = load_config(job["preset"], job["overrides"])
        assert cfg.algorithm.estimator == {"G-T": "grpo", "A-C": "drmas"}[job["cell"]]
        assert cfg.seed in pilot.PILOT_SEEDS and cfg.run.num_threads == 1
        # PROTOCOL.md: the same model and lr as quickstart_math, 32 held-out seeds x k = 4 per role, <= 12 iterations
        assert cfg.models["shared"].name_or_path == quick.models["shared"].name_or_path
        assert cfg.optim.lr == quick.optim.lr and cfg.run.iterations <= 12
        assert cfg.eval.k == 2 * quick.eval.size * quick.eval.k and cfg.eval.opponents == ["random-v0"]
        assert cfg.env.kwargs["opponent"] == "random-v0" and cfg.env.kwargs["opponent_seat"] == "rotate"


@pytest.mark.slow  # a tiny model: 4 runs of one iteration, then 2 runs stopped at the limit (~60 s on 2 cores)
def test_pilot_runs_reuses_and_stops_at_the_limit(tmp_path, capsys):
    pytest.importorskip("pyspiel")
    tiny = ["models.shared.name_or_path=tiny-llama", "eval.k=8", "rollout.batch_size=2", "rollout.max_new_tokens=8",
            "run.save_every=0", "run.plot=false", "run.tensorboard=false"]  # fmt: skip
    argv = ["--candidates", "kuhn_poker", "--iterations", "1", "--jobs", "2", "--runs", str(tmp_path / "runs"),
            "--out", str(tmp_path / "pilot.json"), *tiny]  # fmt: skip
    assert pilot.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == json.loads((tmp_path / "pilot.json").read_text()) and out["protocol"] is False
    assert [r["status"] for r in out["runs"]] == ["finished"] * 4
    for r in out["runs"]:
        summary = json.loads((tmp_path / "runs" / "kuhn_poker" / f"{r['cell']}_seed{r['seed']}" / "summary.json").read_text())
        assert r["outcome"] == pilot.run_outcome(summary["validation"])
    assert out["table"]["kuhn_poker"]["n"] == 4 and "| kuhn_poker |" in out["table_markdown"]
    # finished runs are reused as recorded: the same records without training again
    assert pilot.main([*argv[:-len(tiny)], "--finished-only", *tiny]) == 0
    assert json.loads(capsys.readouterr().out)["runs"] == out["runs"]
    # a limit no run can meet: the first two go over it, the candidate's other two are not trained
    argv = ["--candidates", "tic_tac_toe", "--iterations", "1", "--limit-s", "1", "--runs", str(tmp_path / "slow"),
            "--out", str(tmp_path / "slow.json"), *tiny]  # fmt: skip
    assert pilot.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["status"] for r in out["runs"]] == ["over_limit", "over_limit", "not_run", "not_run"]
    assert out["table"]["tic_tac_toe"]["why"] == "too slow" and out["chosen"] is None


def test_bad_arguments_exit_2(capsys):
    assert pilot.main(["--jobs", "0"]) == 2
    assert pilot.main(["not-an-override"]) == 2
    assert "key=value" in capsys.readouterr().err
