"""avg@k, unbiased pass@k (hand-computed), the reference's any-of-k, standard errors and per-source tables."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from drmas_train.eval.metrics import (
    any_of_k,
    avg_at_k,
    default_k_values,
    mean_stderr,
    pass_at_k,
    pass_at_k_tasks,
    per_agent_stats,
    summarize_episodes,
)

# n = 16 samples. By hand: pass@k = 1 - C(n-c, k) / C(n, k).
#   c=1, k=4: 1 - C(15,4)/C(16,4) = 1 - 1365/1820 = 0.25
#   c=8, k=4: 1 - C(8,4)/C(16,4) = 1 - 70/1820 = 25/26
#   c=1 or 8, k=16: C(n-c, 16) = 0 -> 1
HAND = [
    (0, 1, 0.0),
    (0, 4, 0.0),
    (0, 16, 0.0),
    (1, 1, 1 / 16),
    (1, 4, 0.25),
    (1, 16, 1.0),
    (8, 1, 0.5),
    (8, 4, 25 / 26),
    (8, 16, 1.0),
    (16, 1, 1.0),
    (16, 4, 1.0),
    (16, 16, 1.0),
]


@pytest.mark.parametrize(("c", "k", "expected"), HAND)
def test_pass_at_k_hand_values_n16(c, k, expected):
    assert pass_at_k(16, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(("n", "k"), [(16, 1), (16, 4), (20, 7), (50, 10), (5, 5)])
def test_pass_at_k_matches_binomial_form(n, k):
    for c in range(n + 1):
        assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


@pytest.mark.parametrize("n", [1, 3, 16, 100])
def test_pass_at_1_is_c_over_n(n):
    for c in range(n + 1):
        assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-12)


def test_pass_at_k_is_stable_for_large_n():
    # C(2000, 1000) overflows a float; the product form does not.
    value = pass_at_k(2000, 3, 1000)
    assert value == pytest.approx(1 - (1000 * 999 * 998) / (2000 * 1999 * 1998), rel=1e-12)


def test_pass_at_k_errors():
    with pytest.raises(ValueError, match=r"pass@k is undefined for n=3 samples < k=4"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match=r"need 0 <= c <= n .* got n=4, c=5"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match=r"k must be >= 1, got k=0"):
        pass_at_k(4, 1, 0)
    with pytest.raises(TypeError, match=r"n must be an int, got float"):
        pass_at_k(4.0, 1, 1)
    with pytest.raises(ValueError, match=r"task #1 has only n=2 samples; every task needs n >= k"):
        pass_at_k_tasks([(4, 1), (2, 1)], 3)


def test_any_of_k_equals_unbiased_when_n_equals_k():
    rng = random.Random(0)
    for k in (1, 2, 4, 16):
        tasks = [[rng.random() < p for _ in range(k)] for p in (0.0, 0.1, 0.5, 0.9, 1.0) for _ in range(4)]
        unbiased = pass_at_k_tasks([(len(t), sum(t)) for t in tasks], k)
        assert any_of_k(tasks, k).value == pytest.approx(unbiased.value, abs=1e-12)
    # exhaustively for n = k = 3
    for flags in itertools.product([False, True], repeat=3):
        assert any_of_k([list(flags)], 3).value == pass_at_k(3, sum(flags), 3)


def test_any_of_k_differs_from_unbiased_when_n_greater_than_k():
    last_only = [False] * 15 + [True]  # n=16, c=1, the correct sample is the last one
    first_only = [True] + [False] * 15
    assert pass_at_k(16, 1, 4) == pytest.approx(0.25)
    assert any_of_k([last_only], 4).value == 0.0  # ignores samples 4..15
    assert any_of_k([first_only], 4).value == 1.0  # order-dependent
    # averaged over both orders it is still not the unbiased value in general:
    assert any_of_k([last_only, first_only], 4).value == 0.5 != pass_at_k_tasks([(16, 1), (16, 1)], 4).value
    with pytest.raises(ValueError, match=r"any-of-4: task #0 has only 3 samples"):
        any_of_k([[True, False, False]], 4)


def test_avg_at_k_and_stderr():
    est = avg_at_k([[1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])  # per task 0.5, 1, 0
    assert est.value == pytest.approx(0.5)
    assert est.stderr == pytest.approx(math.sqrt(0.25 / 3))  # std(ddof=1) = 0.5, / sqrt(3)
    assert est.n == 3
    se = mean_stderr([1, 0, 1, 0])
    assert (se.value, se.stderr) == (0.5, pytest.approx(math.sqrt(1 / 3) / 2))
    assert mean_stderr([0.7]).stderr is None
    with pytest.raises(ValueError, match="cannot average an empty list"):
        mean_stderr([])
    with pytest.raises(ValueError, match=r"avg@k: task #1 has no samples"):
        avg_at_k([[1], []])


def test_default_k_values():
    assert default_k_values(16) == [1, 2, 4, 8, 16]
    assert default_k_values(4) == [1, 2, 4]
    assert default_k_values(6) == [1, 2, 4, 6]
    assert default_k_values(1) == [1]


def _row(src, tid, i, won, **kw):
    return {
        "env_id": "toy-v0",
        "data_source": src,
        "task_id": tid,
        "sample_index": i,
        "won": won,
        "reward": float(won),
        "num_turns": 2,
        "calls": {"solver": 1, "verifier": 1},
        "invalid_actions": {"solver": 0, "verifier": int(not won)},
        "tokens_in": {"solver": 10, "verifier": 20},
        "tokens_out": {"solver": 5, "verifier": 1},
        **kw,
    }


def test_summarize_episodes_per_source_and_overall():
    rows = [_row("gsm8k", "t0", i, w) for i, w in enumerate([1, 1, 0, 0])]
    rows += [_row("gsm8k", "t1", i, w) for i, w in enumerate([0, 0, 0, 0])]
    rows += [_row("math500", "t0", i, w) for i, w in enumerate([1, 1, 1, 1])]
    table = summarize_episodes(rows)["toy-v0"]
    assert set(table) == {"gsm8k", "math500", "overall"}
    g = table["gsm8k"]
    assert g["num_tasks"] == 2 and g["samples_per_task"] == 4
    assert g["avg@k"]["value"] == pytest.approx(0.25)
    # pass@2 of (n=4,c=2) = 1 - C(2,2)/C(4,2) = 5/6, of (4,0) = 0 -> mean 5/12
    assert g["pass@k"]["2"]["value"] == pytest.approx(5 / 12)
    assert g["pass@k"]["4"]["value"] == pytest.approx(0.5)
    assert set(g["pass@k"]) == {"1", "2", "4"}
    o = table["overall"]
    assert o["num_tasks"] == 3  # gsm8k/t0 and math500/t0 stay distinct
    assert o["avg@k"]["value"] == pytest.approx((0.5 + 0 + 1) / 3)
    agents = o["agents"]
    assert agents["verifier"]["valid_action_rate"] == pytest.approx(1 - 6 / 12)
    assert agents["solver"]["valid_action_rate"] == 1.0
    assert agents["verifier"]["tokens_in"] == 20 and agents["solver"]["tokens_out"] == 5
    assert "em" not in o


def test_summarize_search_fields_and_errors():
    rows = [_row("nq", "q0", i, w, em=float(w), f1=0.5 + 0.5 * w, num_searches=i) for i, w in enumerate([1, 0])]
    cell = summarize_episodes(rows)["toy-v0"]["nq"]
    assert cell["em"]["value"] == 0.5 and cell["f1"]["value"] == 0.75 and cell["num_searches"]["value"] == 0.5
    with pytest.raises(ValueError, match=r"episode row is missing \['won'\]"):
        summarize_episodes([{"env_id": "x-v0", "data_source": "a", "task_id": "t", "reward": 0}])
    with pytest.raises(ValueError, match="duplicate episode: task_id='q0' sample_index=1"):
        summarize_episodes(rows + [rows[1]])


def test_per_agent_stats_without_calls():
    assert per_agent_stats([{"calls": {}, "tokens_in": {"a": 4}}]) == {
        "a": {"valid_action_rate": None, "calls": 0.0, "tokens_in": 4.0, "tokens_out": 0.0}
    }
