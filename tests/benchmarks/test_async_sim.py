"""benchmarks/perf/async_sim.py: golden cases by hand, eta = 0 against the lock-step formula, properties, the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.scripts import load_script

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "perf" / "async_sim.py"
sim = load_script("benchmarks/perf/async_sim.py")

#: a compute-bound engine: a step of n sequences costs n / 10 s; prefill 100 tokens/s; update 50 tokens/s per worker
HAND = sim.MeasuredCosts(decode_tok_s=10.0, prefill_tok_s=100.0, update_tok_s=50.0, push_time_s=2.0)
TWO = [(sim.Call("m", 100, 20, 0),), (sim.Call("m", 100, 40, 0),)]


def test_sync_golden_two_episodes_by_hand():
    # one worker: prefill 200 tokens = 2 s; both decode 20 tokens at 0.2 s/step = 4 s; the longer one 20 more at
    # 0.1 s/step = 2 s -> rollout 8 s; update 260 tokens / 50 = 5.2 s; push 2 s
    one = sim.sync_iteration(TWO, ["m"], 1, HAND)
    assert one["rollout_s"] == pytest.approx(8.0)
    assert one["update_s"] == pytest.approx(5.2) and one["push_s"] == pytest.approx(2.0)
    assert one["iteration_s"] == pytest.approx(15.2)
    # two workers, one episode each: 1 + 20 x 0.1 = 3 s and 1 + 40 x 0.1 = 5 s; the iteration waits for the
    # slowest (max), then the update on 2 workers (2.6 s) and the push: 5 + 2.6 + 2 = 9.6 s
    two = sim.sync_iteration(TWO, ["m"], 2, HAND)
    assert two["rollout_s"] == pytest.approx(5.0)
    assert two["iteration_s"] == pytest.approx(5.0 + 2.6 + 2.0)
    # mean decode batch over one worker's 6 s of decode: (4 s x 2 + 2 s x 1) / 6 s
    t, t90, decode_s, seq_s = sim.batched_call_s([c for (c,) in TWO], HAND)
    assert (t, t90, decode_s) == pytest.approx((8.0, 8.0, 6.0)) and seq_s / decode_s == pytest.approx(10 / 6)


def test_lockstep_waits_per_slot_and_adds_retrieval():
    # two episodes of two calls: slot 0 lengths 10 / 30, slot 1 lengths 30 / 10, a 0.5 s retrieval after slot 0, no
    # prompt; lock-step on 1 worker: each slot waits for its longer call, then the retrieval
    a = (sim.Call("m", 0, 10, 0, gap_s=0.5), sim.Call("m", 0, 30, 1))
    b = (sim.Call("m", 0, 30, 0, gap_s=0.5), sim.Call("m", 0, 10, 1))
    costs = sim.MeasuredCosts(10.0, 100.0, 50.0)
    it = sim.sync_iteration([a, b], ["m"], 1, costs)
    slot = 10 * 0.2 + 20 * 0.1  # both for 10 tokens, then one for 20: 4 s
    assert it["rollout_s"] == pytest.approx(slot + 0.5 + slot)
    assert it["tail_s"] == pytest.approx(0.0)  # 2 sequences: 90 % of them = both


def test_roofline_step_by_hand():
    hw = sim.Hardware("x", hbm_bytes_per_s=2e12, bf16_flops=1e15, bw_eff=0.5, decode_eff=0.5)
    costs = sim.GPUCosts(hw, {"m": sim.ModelSpec("m", 1e9, 1e5)})
    # memory-bound: (2e9 + 1000 x 1e5) B / 1e12 B/s = 2.1 ms; compute 2e9 x 4 / 5e14 = 16 us
    assert costs.step_s("m", 4, 1000) == pytest.approx(2.1e-3)
    # compute-bound at a large batch: 2e9 x 1e5 / 5e14 = 0.4 s > (2e9 + 0) / 1e12
    assert costs.step_s("m", 100_000, 0) == pytest.approx(0.4)
    assert costs.prefill_s("m", 1000) == pytest.approx(2e9 * 1000 / 5e14)
    assert costs.push_s("m") == pytest.approx(hw.push_s_per_param * 1e9)


def _random_case(seed: int, n_models: int = 1, calls_max: int = 1, gaps: bool = False, iterations: int = 5):
    rng = np.random.default_rng(seed)
    hw = sim.Hardware("x", rng.uniform(1e12, 5e12), rng.uniform(2e14, 1e15), train_mfu=rng.uniform(0.1, 0.5),
                      push_s_per_param=rng.uniform(0, 1e-9))  # fmt: skip
    models = {
        f"m{i}": sim.ModelSpec(f"m{i}", rng.uniform(5e8, 8e9), rng.uniform(2e4, 2e5)) for i in range(n_models)
    }
    names = list(models)
    gpus, n_eps = int(rng.integers(1, 5)), int(rng.integers(1, 6)) * int(rng.integers(1, 5))

    def episode():
        k = int(rng.integers(1, calls_max + 1))
        return tuple(sim.Call(names[s % n_models], int(rng.integers(10, 500)), int(min(2000, rng.lognormal(5, 1))) + 1,
                              s, gap_s=float(rng.uniform(0, 0.5)) if gaps else 0.0) for s in range(k))  # fmt: skip

    batches = [[episode() for _ in range(n_eps)] for _ in range(iterations)]
    return batches, names, gpus, sim.GPUCosts(hw, models)


@pytest.mark.parametrize("seed", range(8))
def test_eta_zero_async_equals_lockstep_sync_for_one_call_episodes(seed):
    # eta = 0: batch k+1 starts only after every model's update and push of batch k; with one call per episode there
    # is no turn barrier to remove, so the event simulation must give the lock-step formula's time (two code paths)
    batches, names, gpus, costs = _random_case(seed)
    sync = sim.simulate_sync(batches, names, gpus, costs)
    asy = sim.simulate_async(batches, names, gpus, costs, eta=0)
    assert asy["s_per_iter"] == pytest.approx(sync["s_per_iter"], rel=1e-9)
    assert asy["max_staleness"] == 0
    hand = sim.simulate_async([TWO] * 3, ["m"], 1, HAND, eta=0, warmup=0)
    assert hand["s_per_iter"] == pytest.approx(15.2)


@pytest.mark.parametrize("seed", range(12))
def test_async_never_slower_than_sync_for_one_model(seed):
    # multi-call episodes with retrieval gaps, one model (a shared LLM): streaming and running ahead never lose
    batches, names, gpus, costs = _random_case(seed, calls_max=3, gaps=True)
    sync = sim.simulate_sync(batches, names, gpus, costs)["s_per_iter"]
    for eta in (0, 1, 2):
        assert sim.simulate_async(batches, names, gpus, costs, eta=eta)["s_per_iter"] <= sync * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(8))
def test_async_with_eta_at_least_one_never_slower_than_sync_for_two_models(seed):
    # two models: at eta = 0 streaming can lose (both models' engines share a GPU's bandwidth with smaller batches,
    # docs/scaling.md); with eta >= 1 the overlap wins in every case tried
    batches, names, gpus, costs = _random_case(seed, n_models=2, calls_max=3, gaps=True)
    sync = sim.simulate_sync(batches, names, gpus, costs)["s_per_iter"]
    for eta in (1, 2):
        assert sim.simulate_async(batches, names, gpus, costs, eta=eta)["s_per_iter"] <= sync * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(10))
def test_monotonic_in_eta_and_staleness_bounded(seed):
    batches, names, gpus, costs = _random_case(
        seed, n_models=1 + seed % 2, calls_max=3, gaps=True, iterations=8
    )
    times = []
    for eta in (0, 1, 2):
        r = sim.simulate_async(batches, names, gpus, costs, eta=eta)
        assert r["max_staleness"] <= eta
        times.append(r["s_per_iter"])
    assert all(b <= a * (1 + 1e-9) for a, b in zip(times, times[1:], strict=False))


def test_split_placement_at_eta_zero_is_serial_on_fewer_workers():
    # 1 generating + 1 training worker, eta = 0: both episodes generate on one worker (prefill 2 s + 4 s + 2 s = 8 s),
    # the update runs on one worker (5.2 s), then the push (2 s): 15.2 s, against 9.6 s for sync on both workers
    r = sim.simulate_async([TWO] * 3, ["m"], 2, HAND, eta=0, placement="split", gen_gpus=1, warmup=0)
    assert r["s_per_iter"] == pytest.approx(15.2)
    assert sim.simulate_sync([TWO] * 3, ["m"], 2, HAND, warmup=0)["s_per_iter"] == pytest.approx(9.6)


def test_bad_arguments():
    with pytest.raises(ValueError, match="eta must be >= 0"):
        sim.AsyncSim([TWO], ["m"], 1, HAND, eta=-1)
    with pytest.raises(ValueError, match="placement must be"):
        sim.AsyncSim([TWO], ["m"], 1, HAND, eta=0, placement="disaggregated")
    with pytest.raises(ValueError, match="0 < gen_gpus < gpus"):
        sim.AsyncSim([TWO], ["m"], 2, HAND, eta=0, placement="split", gen_gpus=2)


def test_measured_quickstart_episodes_match_the_run_metrics():
    # the run's metrics.jsonl, iteration 1: solver response_length 24.125, verifier 30.9375, one call each per episode;
    # iteration 8: 1.438 solver calls per episode (23 of 16 episodes)
    its = sim.load_episodes()
    assert len(its) == 8 and all(len(it) == 16 for it in its)
    solver = [c.response for ep in its[0] for c in ep if c.slot in (0, 2)]
    verifier = [c.response for ep in its[0] for c in ep if c.slot == 1]
    assert np.mean(solver) == pytest.approx(24.125) and np.mean(verifier) == pytest.approx(30.9375)
    assert sum(c.slot in (0, 2) for ep in its[7] for c in ep) == 23


def test_cpu_check_predicts_each_case_from_the_measured_rates():
    out = sim.cpu_check(eta=1)
    same = out["same_core"]
    # on one core the update and generation take turns: async can only remove the turn barriers
    assert same["sync_s_per_iter"] == pytest.approx(same["sync_rollout_s"] + same["sync_update_s"], abs=0.11)
    assert 1.0 <= same["ratio_sync_over_async"] < 1.2
    # two cores, one thread each: the update (the larger term) overlaps the rollout: async ~ max(update, rollout)
    two = out["two_cores_1_thread_each"]
    assert two["async_s_per_iter"] >= two["sync_update_s"] - 0.1 and two["ratio_sync_over_async"] > 1.0
    assert out["measured_async"].startswith("pending")
    eta0 = sim.cpu_check(eta=0)
    assert eta0["same_core"]["ratio_sync_over_async"] >= 1.0


def test_predict_ratio_hook_by_hand():
    r = sim.predict_ratio(10.0, 50.0, 2.0, [TWO] * 3, prefill_tok_s=100.0, eta=0)
    assert (r["sync_s_per_iter"], r["async_s_per_iter"], r["ratio"]) == pytest.approx((15.2, 15.2, 1.0))


def test_roofline_cross_check_within_2x_of_the_published_figure():
    check = sim.roofline_check()
    assert 0.5 <= check["model_tok_s"] / check["published_tok_s"] <= 2.0


@pytest.mark.parametrize("name", sorted(sim.SETUPS))
def test_cli_prints_valid_json_for_each_preset(name):
    out = subprocess.run([sys.executable, str(_PATH), "--setup", name, "--groups", "2", "--iterations", "3",
                          "--eta", "1"], capture_output=True, text=True, check=True)  # fmt: skip
    doc = json.loads(out.stdout)
    (row,) = doc["rows"]
    assert row["setup"] == name and row["gpus"] == sim.SETUPS[name].gpus
    assert row["episodes_per_iter"] == 2 * sim.SETUPS[name].group_size
    col = row["async"]["eta=1"]["colocated"]
    assert math.isfinite(col["s_per_iter"]) and col["s_per_iter"] > 0 and col["max_staleness"] <= 1
    assert row["dominant_sync_term"] in ("rollout_s", "update_s", "push_s")


def test_cli_bad_input_exits_2_with_one_line():
    out = subprocess.run([sys.executable, str(_PATH), "--eta", "-1"], capture_output=True, text=True)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and not out.stdout


@pytest.mark.slow
def test_the_doc_table_is_the_scripts_output():
    # docs/scaling.md section 7 prints `python benchmarks/perf/async_sim.py --eta 0 1 2 --markdown` (~45 s)
    out = subprocess.run([sys.executable, str(_PATH), "--eta", "0", "1", "2", "--markdown"], capture_output=True,
                         text=True, check=True).stdout.strip().splitlines()  # fmt: skip
    doc = (_PATH.parents[2] / "docs" / "scaling.md").read_text().splitlines()
    start = doc.index(out[0])
    assert doc[start : start + len(out)] == out
