"""Tests of benchmarks/stability/theory.py: Dr. MAS Proposition 4.3 checked by Monte Carlo with the project's
own estimators (seeded; the whole file runs in a few seconds)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers.scripts import load_script

theory = load_script("benchmarks/stability/theory.py", "stability_theory")


@pytest.fixture(scope="module")
def skewed():
    """The issue's case: shares 0.9/0.1, success 0.9/0.1 (50 groups x 2000 calls, seed 0)."""
    return theory.simulate([0.9, 0.1], [0.9, 0.1], seed=0)


def test_closed_form_golden():
    # mu = 0.9*0.9 + 0.1*0.1 = 0.82, sigma^2 = 0.82*0.18 = 0.1476
    # agent 1: (0.09 + 0.08^2) / 0.1476 = 0.0964 / 0.1476; agent 2: (0.09 + 0.72^2) / 0.1476 = 0.6084 / 0.1476
    f = theory.closed_form_factors([0.9, 0.1], [0.9, 0.1])
    np.testing.assert_allclose(f, [0.0964 / 0.1476, 0.6084 / 0.1476], rtol=1e-12)
    assert f[0] == pytest.approx(0.653117, abs=1e-6) and f[1] == pytest.approx(4.121951, abs=1e-6)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_closed_form_weighted_sum_is_one(seed):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(4))
    q = rng.random(4)
    assert float(p @ theory.closed_form_factors(p, q)) == pytest.approx(1.0, abs=1e-12)


def test_global_normalisation_matches_proposition(skewed):
    fac = np.asarray(skewed["estimators"]["grpo_step"]["factor"])
    np.testing.assert_allclose(fac, [0.653, 4.122], rtol=0.02)
    grad = np.asarray(skewed["estimators"]["grpo_step"]["grad_factor"])  # mean ||A z||^2 / d
    np.testing.assert_allclose(grad, [0.653, 4.122], rtol=0.03)
    assert skewed["estimators"]["grpo_step"]["weighted_sum"] == pytest.approx(1.0, rel=0.01)
    assert fac[1] / fac[0] > 6.0  # the minority agent's gradients are ~6x larger in squared norm


def test_drmas_factors_are_one(skewed):
    res = skewed["estimators"]["drmas"]
    np.testing.assert_allclose(res["factor"], [1.0, 1.0], rtol=0.01)
    np.testing.assert_allclose(res["grad_factor"], [1.0, 1.0], rtol=0.03)
    assert res["weighted_sum"] == pytest.approx(1.0, rel=0.01)


def test_grpo_trajectory_average_is_reported_and_milder(skewed):
    fac = skewed["estimators"]["grpo"]["factor"]
    # calls inherit the trajectory's standardised mean score: much closer to 1 than grpo_step's 4.12
    assert 0.9 < fac[0] < 1.05 and 1.0 < fac[1] < 2.0
    assert skewed["estimators"]["grpo"]["weighted_sum"] == pytest.approx(1.0, rel=0.01)


@pytest.mark.parametrize(("shares", "success"), [([0.5, 0.5], [0.3, 0.3]), ([0.8, 0.2], [0.6, 0.6])])
def test_symmetric_rewards_give_one_for_both(shares, success):
    res = theory.simulate(shares, success, n_groups=20, seed=4)
    np.testing.assert_allclose(res["closed_form"]["global"], [1.0, 1.0], rtol=1e-12)
    for name in ("grpo_step", "drmas"):
        np.testing.assert_allclose(res["estimators"][name]["factor"], [1.0, 1.0], rtol=0.03)


def test_population_std_removes_finite_group_bias():
    res = theory.simulate([0.9, 0.1], [0.9, 0.1], n_groups=5, group_size=100, unbiased=False, seed=5)
    # with the population std, sum of A^2 over a (non-constant) group is exactly its size (up to eps)
    assert res["estimators"]["grpo_step"]["weighted_sum"] == pytest.approx(1.0, abs=1e-4)
    unb = theory.simulate([0.9, 0.1], [0.9, 0.1], n_groups=5, group_size=100, unbiased=True, seed=5)
    assert unb["estimators"]["grpo_step"]["weighted_sum"] == pytest.approx(0.99, abs=1e-4)  # (M-1)/M


def test_cli_prints_json(capsys, tmp_path):
    out = tmp_path / "t.json"
    argv = [
        "--shares",
        "0.5",
        "0.5",
        "--success",
        "0.2",
        "0.8",
        "--groups",
        "4",
        "--group-size",
        "200",
        "--out",
        str(out),
    ]
    assert theory.main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == printed
    # mu = 0.5, sigma^2 = 0.25: each agent (0.16 + 0.09) / 0.25 = 1.0 -- equal shares, symmetric gaps
    np.testing.assert_allclose(printed["closed_form"]["global"], [1.0, 1.0])
    assert set(printed["estimators"]) == {"grpo_step", "drmas", "grpo"}


@pytest.mark.parametrize(
    ("shares", "success", "kw", "match"),
    [
        ([0.9, 0.2], [0.5, 0.5], {}, r"shares must be positive and sum to 1, got \[0\.9, 0\.2\]"),
        ([0.5, 0.5], [0.5], {}, r"one entry per agent, got 2 and 1"),
        ([1.0], [1.2], {}, r"success rates must lie in \[0, 1\], got \[1\.2\]"),
        ([0.5, 0.5], [1.0, 1.0], {}, r"pooled reward has zero variance"),
        ([0.99, 0.01], [0.5, 0.5], {"group_size": 100}, r"fewer than 2 calls per group \(\[99, 1\]\)"),
        ([0.5, 0.5], [0.5, 0.5], {"group_size": 100, "calls_per_traj": 7}, r"calls_per_traj=7 must divide"),
        ([0.5, 0.5], [0.5, 0.5], {"n_groups": 0}, r"n_groups must be a positive integer, got 0"),
        ([0.5, 0.5], [0.5, 0.5], {"estimators": ["drmass"]}, r"unknown advantage estimator 'drmass'"),
    ],
)
def test_bad_input(shares, success, kw, match):
    with pytest.raises(ValueError, match=match):
        theory.simulate(shares, success, **kw)
