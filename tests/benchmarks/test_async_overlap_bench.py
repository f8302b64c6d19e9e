"""benchmarks/perf/async_overlap.py: each arm's figures from its metrics rows, and the equal-samples and
equal-wall-clock comparisons, on hand-built rows (the arms themselves are real runs, measured by hand)."""

from __future__ import annotations

import pytest

from helpers.scripts import load_script

bench = load_script("benchmarks/perf/async_overlap.py")


def _rows(elapsed: dict[int, float], staleness: float | None = None) -> list[dict]:
    rows = []
    for it, t in elapsed.items():
        row = {"iteration": it, "perf/elapsed_s": t, "perf/iteration_s": 10.0 * it, "perf/rollout_s": 1.0 * it,
               "perf/generate_s": 2.0, "perf/update_s": 3.0, "perf/eval_s": 0.0}  # fmt: skip
        if staleness is not None:
            row["staleness/m/mean"] = staleness * (it % 2)
        rows.append(row)
    return rows


def _quickstart(gains: dict[int, float]) -> dict:
    validation = [{"iteration": 0, "avg@4": 0.1, "stderr": 0.02}]
    validation += [{"iteration": it, "avg@4": 0.1 + g, "stderr": 0.03, "gain": g, "gain_stderr": 0.05}
                   for it, g in gains.items()]  # fmt: skip
    return {"validation": validation, "wall_time_s": 99.0}


def test_arm_record_adds_elapsed_per_validation_and_mean_timings():
    rec = bench.arm_record(_quickstart({2: 0.1, 4: 0.3}), _rows({1: 50.0, 2: 100.0, 3: 150.0, 4: 200.0}, 1.0))
    assert [v["elapsed_s"] for v in rec["validation"]] == [0.0, 100.0, 200.0]
    assert rec["perf_mean_s"]["iteration_s"] == 25.0 and rec["perf_mean_s"]["rollout_s"] == 2.5
    assert rec["staleness_mean"] == 0.5  # iterations 1 and 3 at 1, 2 and 4 at 0
    assert rec["train_s_per_iteration"] == 25.0  # iteration_s 10, 20, 30, 40 minus eval_s 0


def test_equal_wall_clock_reads_each_sync_arm_where_the_async_arm_finished():
    sync = bench.arm_record(_quickstart({2: 0.1, 4: 0.2, 6: 0.3, 8: 0.4}),
                            _rows({2: 100.0, 4: 200.0, 6: 300.0, 8: 400.0}))  # fmt: skip
    fast = bench.arm_record(_quickstart({2: 0.15, 4: 0.25, 6: 0.3, 8: 0.35}),
                            _rows({2: 60.0, 4: 120.0, 6: 180.0, 8: 250.0}, 1.0))  # fmt: skip
    out = bench.compare({"sync_2t": sync, "async_overlap": fast})
    assert out["equal_samples"]["sync_2t"] == {"iteration": 8, "gain": 0.4, "gain_stderr": 0.05, "wall_time_s": 99.0}
    assert out["equal_wall_clock"]["seconds"] == 250.0
    assert out["equal_wall_clock"]["sync_2t"]["iteration"] == 4  # validated at 200 s; iteration 6 only at 300 s
    assert out["equal_wall_clock"]["async_overlap"]["gain"] == 0.35
    assert out["speedup_sync_2t"] == {"elapsed": pytest.approx(400.0 / 250.0), "train_s_per_iteration": 1.0}
    assert bench.gain_at(sync, 50.0) is None  # nothing validated with a gain that early


def test_an_arm_without_elapsed_seconds_is_refused():
    rows = [{k: v for k, v in r.items() if k != "perf/elapsed_s"} for r in _rows({2: 1.0})]
    with pytest.raises(KeyError, match="perf/elapsed_s"):
        bench.arm_record(_quickstart({2: 0.1}), rows)


def test_each_async_arm_is_compared_with_the_sync_arms_of_its_own_path():
    slow = bench.arm_record(_quickstart({2: 0.1, 4: 0.2}), _rows({2: 100.0, 4: 200.0}))
    fast = bench.arm_record(_quickstart({2: 0.2, 4: 0.3}), _rows({2: 70.0, 4: 150.0}, 1.0))
    out = bench.compare({"sync_2t": slow, "async_overlap": fast, "ray_sync": slow, "ray_async_overlap": fast})
    assert set(out["equal_wall_clock"]) == {"seconds", "async_overlap", "sync_2t"}  # not the Ray arms
    assert set(out["ray_equal_wall_clock"]) == {"seconds", "ray_async_overlap", "ray_sync"}
    assert out["ray_equal_wall_clock"]["ray_sync"]["iteration"] == 2  # validated at 100 s <= 150 s
    assert out["speedup_ray_sync"]["elapsed"] == pytest.approx(200.0 / 150.0)
    only_ray = bench.compare({"ray_sync": slow, "ray_async_overlap": fast})
    assert "equal_wall_clock" not in only_ray and only_ray["ray_equal_wall_clock"]["seconds"] == 150.0
    assert all(o in bench.ARMS["ray_async_overlap"] for o in (*bench.RAY, *bench.ASYNC))
