"""Every advantage estimator against the Dr. MAS reference's own implementation (``langfengQ/DrMAS``).

The reference functions are re-implemented in torch from their file:line in ``reference_estimators.py`` (token-level
tables, the reference's dict accumulators and loops). Both sides run on random tables held back for this test
(seeds 9101-9105, used nowhere else): 3-6 prompt groups of 1, 2, 3 or 5 rollouts plus one of a single call (so
singleton groups occur under every grouping), 1-5 calls per trajectory by three agents, scores from a handful of values (ties), 1-6 response tokens per call,
anchor states drawn from three per prompt. Agreement is required to 1e-6.

How drmas's groupings map to the reference (``verl/trainer/ppo/ray_trainer.py:269-274``): ``prompt`` is
``index = uid`` without ``group_by_agent_id``; the call-level groupings are ``group_by_agent_id=True`` with
``index`` = ``uid`` (``prompt_call``), ``f"{uid}_{agent_id}"`` (``prompt_agent``, the reference's Dr. MAS) or
``f"{uid}_{agent_id}_{turn}"`` (``prompt_agent_turn``).

Deliberate differences, each compared where the definitions coincide and shown separately:

* ``prompt`` grouping for RLOO, REINFORCE++-baseline, pass@k, GiGPO and ReMax: drmas uses a trajectory's mean call
  score for the statistics *and* for each of its calls (as the reference's GRPO); the reference takes the first
  call's score into the statistics and each call's own score (pass@k: only the first call of the best trajectory).
  They coincide on tables whose trajectories have one score for all their calls.
* NaN scores: the reference propagates them into their group (or, through the batch whitening, everywhere); drmas
  leaves them out. Rows in NaN-free groups coincide.
* pass@k groups of one: the reference raises, drmas gives 0.
* REINFORCE++ with ``gamma < 1``: the reference's advantage varies along a response; drmas refuses it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fidelity.reference_estimators as ref
from drmas_train.algorithm.advantages import (
    anchor_groups,
    env_rounds,
    gigpo,
    greedy_baseline,
    grpo,
    grpo_passk,
    reinforce_pp,
    reinforce_pp_baseline,
    remax,
    rloo,
    step_discounted_returns,
)
from drmas_train.algorithm.sample_advantages import gigpo_step_rewards
from drmas_train.collect.samples import Sample

SEEDS = (9101, 9102, 9103, 9104, 9105)
GROUPINGS = ("prompt", "prompt_call", "prompt_agent", "prompt_agent_turn")
CALL_GROUPINGS = GROUPINGS[1:]
AGENTS = ("verifier", "search", "answer")
ATOL = 1e-6


def random_table(seed: int, *, uniform_traj: bool = False, nan: bool = False) -> dict[str, np.ndarray]:
    """Columns of one random batch (see the module doc). ``uniform_traj``: every call of a trajectory has the
    trajectory's score (no penalty differs). ``nan``: two scores are NaN."""
    rng = np.random.default_rng(seed)
    rows = []
    n_prompts = int(rng.integers(3, 7))
    for p in range(
        n_prompts + 1
    ):  # the last prompt: one rollout of one call, a singleton under every grouping
        for g in range(int(rng.choice([1, 2, 3, 5])) if p < n_prompts else 1):
            reward = float(rng.choice([0.0, 1.0, 0.5]))
            counts: dict[str, int] = {}
            for t in range(int(rng.integers(1, 6)) if p < n_prompts else 1):
                agent = str(rng.choice(AGENTS, p=[0.5, 0.3, 0.2]))
                penalty = 0.0 if uniform_traj else float(rng.choice([0.0, 0.0, 0.01, 0.1]))
                rows.append(dict(uid=f"q{p}", traj=f"q{p}/{g}", agent=agent, agent_turn=counts.get(agent, 0), turn=t,
                                 episode=reward, score=reward - penalty, length=int(rng.integers(1, 7)),
                                 anchor=f"state{int(rng.integers(0, 3))}"))  # fmt: skip
                counts[agent] = counts.get(agent, 0) + 1
    table = {k: np.array([r[k] for r in rows], dtype=object if k in ("uid", "traj", "agent", "anchor") else None)
             for k in rows[0]}  # fmt: skip
    if nan:
        table["score"] = table["score"].astype(np.float64)
        table["score"][rng.choice(len(rows), size=2, replace=False)] = np.nan
    return table


def index_of(t, grouping: str) -> tuple[np.ndarray, bool]:
    """The reference's (``index``, ``group_by_agent_id``) for a drmas grouping."""
    if grouping == "prompt":
        return t["uid"], False
    if grouping == "prompt_call":
        return t["uid"], True
    if grouping == "prompt_agent":
        return ref.group_index(t["uid"], t["agent"], True), True
    return np.array([f"{u}_{a}_{k}" for u, a, k in zip(t["uid"], t["agent"], t["agent_turn"], strict=True)],
                    dtype=object), True  # fmt: skip


def cols(t, grouping: str) -> dict:
    return dict(
        uid=t["uid"], agent_id=t["agent"], traj_uid=t["traj"], turn=t["agent_turn"], grouping=grouping
    )


def tables(t):
    return ref.token_table(t["score"], t["length"])


def subset(t, rows) -> dict[str, np.ndarray]:
    return {k: v[rows] for k, v in t.items()}


def group_units(t, grouping: str) -> tuple[np.ndarray, np.ndarray]:
    """(B,) group key and (B,) unit key (trajectory under ``prompt``, row otherwise) as strings."""
    index, by_agent = index_of(t, grouping)
    unit = t["traj"] if not by_agent else np.arange(len(index)).astype(str)
    return np.asarray(index).astype(str), np.asarray(unit).astype(str)


def units_per_group(t, grouping: str) -> np.ndarray:
    """(B,) number of units in each row's group."""
    key, unit = group_units(t, grouping)
    n = {k: len(set(unit[key == k])) for k in set(key)}
    return np.array([n[k] for k in key])


def clean_rows(t, grouping: str) -> np.ndarray:
    """(B,) bool: rows whose group holds no NaN score."""
    key, _ = group_units(t, grouping)
    dirty = set(key[~np.isfinite(t["score"].astype(np.float64))])
    return np.array([k not in dirty for k in key])


def cases():
    """(seed, grouping) for every held-back seed and grouping."""
    return [pytest.param(seed, g, id=f"{g}-{seed}") for seed in SEEDS for g in GROUPINGS]


def table_for(seed: int, grouping: str, **kw):
    """The held-back table of ``seed``; one-score trajectories under ``prompt`` (see the module doc)."""
    return random_table(seed, uniform_traj=grouping == "prompt", **kw)


@pytest.mark.parametrize("grouping", GROUPINGS)
def test_the_tables_hold_singletons_ties_and_mixed_group_sizes(grouping):
    sizes, tied = set(), False
    for seed in SEEDS:
        t = table_for(seed, grouping)
        n = units_per_group(t, grouping)
        sizes |= set(n.tolist())
        key, _ = group_units(t, grouping)
        tied |= any(len(set(t["score"][key == k])) < (key == k).sum() for k in set(key))
    assert 1 in sizes and len(sizes) >= 3 and tied
    assert sum(
        np.isnan(random_table(seed, nan=True)["score"].astype(float)).sum() for seed in SEEDS
    ) == 2 * len(SEEDS)


# ---------------------------------------------------------------- GRPO (the existing estimators, on random tables)


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize(("seed", "grouping"), cases())
def test_grpo_family(seed, grouping, norm):
    t = random_table(
        seed
    )  # the reference's GRPO averages trajectories too: general tables for every grouping
    rewards, mask = tables(t)
    index, by_agent = index_of(t, grouping)
    want = ref.per_row(ref.compute_grpo_outcome_advantage(rewards, mask, index, t["traj"], norm_adv_by_std_in_grpo=norm,
                                                          group_by_agent_id=by_agent)[0], mask)  # fmt: skip
    ours = grpo(t["score"], **cols(t, grouping), norm_by_std=norm)
    np.testing.assert_allclose(ours, want, atol=ATOL, rtol=0)


# ---------------------------------------------------------------- RLOO


@pytest.mark.parametrize(("seed", "grouping"), cases())
def test_rloo(seed, grouping):
    t = table_for(seed, grouping)
    rewards, mask = tables(t)
    index, by_agent = index_of(t, grouping)
    want = ref.per_row(ref.compute_rloo_outcome_advantage(rewards, mask, index, t["traj"], group_by_agent_id=by_agent)[0],
                       mask)  # fmt: skip
    np.testing.assert_allclose(rloo(t["score"], **cols(t, grouping)), want, atol=ATOL, rtol=0)


# ---------------------------------------------------------------- REINFORCE++-baseline and REINFORCE++


@pytest.mark.parametrize(("seed", "grouping"), cases())
def test_reinforce_pp_baseline(seed, grouping):
    t = table_for(seed, grouping)
    rewards, mask = tables(t)
    index, by_agent = index_of(t, grouping)
    want = ref.per_row(ref.compute_reinforce_plus_plus_baseline_outcome_advantage(
        rewards, mask, index, t["traj"], group_by_agent_id=by_agent)[0], mask)  # fmt: skip
    ours = reinforce_pp_baseline(t["score"], **cols(t, grouping), token_count=t["length"])
    np.testing.assert_allclose(ours, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("seed", SEEDS)
def test_reinforce_pp(seed):
    t = random_table(seed)
    rewards, mask = tables(t)
    want = ref.per_row(ref.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=1.0)[0], mask)
    ours = reinforce_pp(t["score"], uid=t["uid"], agent_id=t["agent"], token_count=t["length"])
    np.testing.assert_allclose(ours, want, atol=ATOL, rtol=0)


def test_reinforce_pp_discount_is_per_token_so_drmas_refuses_it():
    t = random_table(SEEDS[0])
    rewards, mask = tables(t)
    adv = ref.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.9)[0]
    long = int(np.argmax(t["length"]))  # a call with several tokens: its advantage changes along the response
    assert t["length"][long] > 1 and float(adv[long, 0]) != pytest.approx(
        float(adv[long, t["length"][long] - 1])
    )
    with pytest.raises(ValueError, match=r"reinforce_pp supports gamma = 1 only, got 0.9"):
        reinforce_pp(t["score"], uid=t["uid"], agent_id=t["agent"], gamma=0.9)


# ---------------------------------------------------------------- GRPO-pass@k


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize(("seed", "grouping"), cases())
def test_grpo_passk(seed, grouping, norm):
    full = table_for(seed, grouping)
    t = subset(full, units_per_group(full, grouping) >= 2)  # the reference raises on groups of one
    rewards, mask = tables(t)
    index, by_agent = index_of(t, grouping)
    want = ref.per_row(ref.compute_grpo_passk_outcome_advantage(rewards, mask, index, t["traj"],
                                                                norm_adv_by_std_in_grpo=norm,
                                                                group_by_agent_id=by_agent)[0], mask)  # fmt: skip
    ours = grpo_passk(t["score"], **cols(t, grouping), norm_by_std=norm)
    if grouping == "prompt":  # the reference reinforces the first call of the best trajectory only
        first = np.r_[True, t["traj"][1:] != t["traj"][:-1]]
        np.testing.assert_allclose(ours[first], want[first], atol=ATOL, rtol=0)
        for traj in set(t["traj"]):  # drmas gives every call of a trajectory the trajectory's advantage
            assert np.ptp(ours[t["traj"] == traj]) == 0.0
    else:
        np.testing.assert_allclose(ours, want, atol=ATOL, rtol=0)
    assert np.count_nonzero(want) <= len(set(index))  # at most one reinforced unit per group


def test_grpo_passk_groups_of_one_get_zero_where_the_reference_raises():
    t = random_table(SEEDS[1])
    rewards, mask = tables(t)
    index, by_agent = index_of(t, "prompt_agent")
    lone = units_per_group(t, "prompt_agent") == 1
    assert lone.any()
    with pytest.raises(ValueError, match="Pass@k requires at least 2 samples per group"):
        ref.compute_grpo_passk_outcome_advantage(rewards, mask, index, t["traj"], group_by_agent_id=by_agent)
    np.testing.assert_array_equal(grpo_passk(t["score"], **cols(t, "prompt_agent"))[lone], 0.0)


# ---------------------------------------------------------------- ReMax


@pytest.mark.parametrize(("seed", "grouping"), cases())
def test_remax(seed, grouping):
    t = table_for(seed, grouping)
    rng = np.random.default_rng(seed + 1)
    per_uid = {
        u: float(rng.choice([0.0, 0.5, 1.0])) for u in set(t["uid"])
    }  # a greedy episode's score per prompt
    b = (
        np.array([per_uid[u] for u in t["uid"]])
        if grouping == "prompt"
        else rng.choice([0.0, 0.5, 1.0], len(t["uid"]))
    )
    rewards, mask = tables(t)
    want = ref.per_row(ref.compute_remax_outcome_advantage(rewards, torch.tensor(b), mask)[0], mask)
    np.testing.assert_allclose(remax(t["score"], **cols(t, grouping), baseline=b), want, atol=ATOL, rtol=0)


def test_greedy_baseline_keys_and_fallbacks():
    """Hand-computed: the greedy episode of q0 made a verifier call (1.0) and a search call (0.0) then the verifier
    again (0.5); q1's greedy episode made no call."""
    batch = dict(uid=["q0", "q0", "q0", "q0", "q1"], agent_id=["verifier", "verifier", "answer", "search", "verifier"],
                 turn=[0, 1, 0, 3, 0])  # fmt: skip
    greedy = dict(greedy_scores=[1.0, 0.0, 0.5], greedy_uid=["q0"] * 3,
                  greedy_agent_id=["verifier", "search", "verifier"], greedy_turn=[0, 0, 1])  # fmt: skip
    np.testing.assert_allclose(greedy_baseline("prompt", **batch, **greedy), [0.5, 0.5, 0.5, 0.5, 0.0])
    np.testing.assert_allclose(
        greedy_baseline("prompt_agent", **batch, **greedy), [0.75, 0.75, 0.5, 0.0, 0.0]
    )
    # (q0, verifier, 1) -> 0.5; (q0, search, 3) is missing -> (q0, search) -> 0.0; answer never acted -> q0's 0.5
    np.testing.assert_allclose(
        greedy_baseline("prompt_agent_turn", **batch, **greedy), [1.0, 0.5, 0.5, 0.0, 0.0]
    )


# ---------------------------------------------------------------- GiGPO


def reference_step_rewards(t, gamma):
    """The reference's GiGPO step rewards for the table: ``compute_step_discounted_returns`` (rounds as env steps,
    the env reward R paid in the last round) minus each call's penalty (``ray_trainer.py:222-223``)."""
    rounds = env_rounds(t["traj"], t["turn"], t["agent"])
    last = {tr: rounds[t["traj"] == tr].max() for tr in set(t["traj"])}
    env_reward = np.where([r == last[tr] for r, tr in zip(rounds, t["traj"], strict=True)], t["episode"], 0.0)
    returns = ref.compute_step_discounted_returns(env_reward, t["traj"], np.ones(len(rounds)), rounds, gamma)
    return returns.double() - torch.tensor(t["episode"] - t["score"], dtype=torch.float64)


@pytest.mark.parametrize("mode", ["mean_std_norm", "mean_norm"])
@pytest.mark.parametrize(("seed", "grouping"), cases())
def test_gigpo(seed, grouping, mode):
    t = table_for(seed, grouping)
    rewards, mask = tables(t)
    index, by_agent = index_of(t, grouping)
    if grouping == "prompt_call":  # the reference's step groups are (index, anchor): index = uid here too
        index = t["uid"]
    step = reference_step_rewards(t, 0.95)
    want = ref.per_row(ref.compute_gigpo_outcome_advantage(rewards, step, mask, t["anchor"], index, t["traj"],
                                                           step_advantage_w=0.7, mode=mode,
                                                           group_by_agent_id=by_agent)[0], mask)  # fmt: skip
    ours = gigpo(t["score"], **cols(t, grouping), anchor=t["anchor"], step_rewards=step.numpy(), step_weight=0.7,
                 norm_by_std=mode == "mean_std_norm")  # fmt: skip
    np.testing.assert_allclose(ours, want, atol=ATOL, rtol=0)


def test_gigpo_similarity_groups_match_the_reference():
    texts = ["Step 1: <search>capital of France</search>", "Step 1: <search>capital of france</search>",
             "Step 1: <search>who wrote Hamlet</search>", "Step 1: <search>capital of Frances</search>",
             "Step 1: <search>who wrote Hamlet?</search>", "unrelated"]  # fmt: skip
    rng = np.random.default_rng(SEEDS[2])
    anchor = np.array([texts[i] for i in rng.integers(0, len(texts), 40)], dtype=object)
    key = rng.integers(0, 3, 40)
    ours = anchor_groups(key, anchor, similarity_thresh=0.9)
    theirs = ref.build_step_group(anchor, key, enable_similarity=True, similarity_thresh=0.9)
    # the same partition (labels differ): two rows share a group in one iff they share it in the other
    np.testing.assert_array_equal(ours[:, None] == ours[None, :], theirs[:, None] == theirs[None, :])
    assert len(set(ours)) < len(set(zip(key, anchor, strict=True)))  # near-duplicates were merged


@pytest.mark.parametrize("gamma", [1.0, 0.95, 0.0])
@pytest.mark.parametrize("seed", SEEDS)
def test_step_discounted_returns_and_sample_step_rewards(seed, gamma):
    t = random_table(seed)
    rounds = env_rounds(t["traj"], t["turn"], t["agent"])
    rewards = np.random.default_rng(seed).choice([0.0, 1.0, 0.5], len(rounds))  # any per-step reward
    want = ref.compute_step_discounted_returns(
        rewards, t["traj"], np.ones(len(rounds)), rounds, gamma
    ).numpy()
    ours = step_discounted_returns(rewards, traj_uid=t["traj"], env_step=rounds, gamma=gamma)
    np.testing.assert_allclose(ours, want, atol=ATOL, rtol=0)
    samples = [Sample(u, tr, a, "m", int(k), int(at), [1], [2], [0.0], [1], reward=float(s), score=float(e))
               for u, tr, a, k, at, s, e in zip(t["uid"], t["traj"], t["agent"], t["turn"], t["agent_turn"], t["score"],
                                                t["episode"], strict=True)]  # fmt: skip
    np.testing.assert_allclose(gigpo_step_rewards(samples, gamma), reference_step_rewards(t, gamma).numpy(), atol=ATOL,
                               rtol=0)  # fmt: skip
    if gamma == 1.0:
        np.testing.assert_array_equal(gigpo_step_rewards(samples, gamma), t["score"].astype(np.float64))


def test_env_rounds_are_the_reference_env_steps_of_search():
    # search: V S | V S | V A (one orchestra run per env step); math episodes are split the same way, but the
    # reference counts a whole math episode as one env step (next test)
    traj = ["a"] * 6 + ["b"] * 3
    agent = ["verifier", "search", "verifier", "search", "verifier", "answer", "solver", "verifier", "solver"]
    turn = [0, 1, 2, 3, 4, 5, 0, 1, 2]
    assert env_rounds(traj, turn, agent).tolist() == [0, 0, 1, 1, 2, 2, 0, 0, 1]


@pytest.mark.parametrize("gamma", [0.95, 0.0])
@pytest.mark.parametrize("seed", SEEDS)
def test_math_step_rewards_are_one_env_step_per_episode_as_in_the_reference(seed, gamma):
    """The reference's math env is done after one step (agent_system/environments/env_package/math/envs.py:22-23)
    and every Solver/Verifier call of the episode gets env_step 1 (agent_system/agent/agents/math/solver_agent.py:59,
    rollout_loop.py:452): compute_step_discounted_returns then gives every call R, whatever gamma. The math envs say
    so in metadata["reference_env_step"], and gigpo_step_rewards with "episode" agrees with the reference."""
    import drmas_envs

    t = random_table(seed)
    env_reward = np.array(t["episode"], dtype=np.float64)
    returns = ref.compute_step_discounted_returns(env_reward, t["traj"], np.ones(len(env_reward)),
                                                  np.ones(len(env_reward), dtype=np.int64), gamma)  # fmt: skip
    want = returns.double().numpy() - (t["episode"] - t["score"])
    samples = [Sample(u, tr, a, "m", int(k), int(at), [1], [2], [0.0], [1], reward=float(s), score=float(e))
               for u, tr, a, k, at, s, e in zip(t["uid"], t["traj"], t["agent"], t["turn"], t["agent_turn"], t["score"],
                                                t["episode"], strict=True)]  # fmt: skip
    np.testing.assert_allclose(gigpo_step_rewards(samples, gamma, "episode"), want, atol=ATOL, rtol=0)
    assert not np.allclose(gigpo_step_rewards(samples, gamma, "round"), want)  # rounds would discount early calls
    assert drmas_envs.make("math-solver-verifier-v0").metadata["reference_env_step"] == "episode"
    assert drmas_envs.make("search-orchestrator-v0").metadata["reference_env_step"] == "round"
    with pytest.raises(ValueError, match="env_step='turn'; accepted: round, episode"):
        gigpo_step_rewards(samples, gamma, "turn")


# ---------------------------------------------------------------- deliberate differences


@pytest.mark.parametrize("seed", SEEDS)
def test_prompt_grouping_trajectory_mean_vs_the_reference_first_call(seed):
    """With penalties that differ inside a trajectory, the reference's RLOO uses the first call's score in the
    group mean and each call's own score; drmas uses the trajectory mean for both (as GRPO)."""
    t = random_table(seed)  # scores differ inside trajectories
    rewards, mask = tables(t)
    want = ref.per_row(ref.compute_rloo_outcome_advantage(rewards, mask, t["uid"], t["traj"])[0], mask)
    ours = rloo(t["score"], **cols(t, "prompt"))
    assert np.abs(ours - want).max() > 1e-3  # the definitions differ here
    for traj in set(t["traj"]):
        assert np.ptp(ours[t["traj"] == traj]) == 0.0  # one advantage per trajectory in drmas
    # drmas's value is RLOO over trajectory means: the reference's function on a table of one row per trajectory
    first = np.r_[True, t["traj"][1:] != t["traj"][:-1]]
    means = np.array([t["score"][t["traj"] == tr].mean() for tr in t["traj"][first]])
    r1, m1 = ref.token_table(means, np.ones(len(means), dtype=int))
    per_traj = ref.per_row(
        ref.compute_rloo_outcome_advantage(r1, m1, t["uid"][first], t["traj"][first])[0], m1
    )
    np.testing.assert_allclose(ours[first], per_traj, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["grpo", "rloo", "grpo_passk", "gigpo"])
@pytest.mark.parametrize("seed", SEEDS)
def test_nan_scores_poison_the_reference_group_but_not_drmas(seed, name):
    t = random_table(seed, nan=True)
    g = "prompt_agent"
    rewards, mask = tables(t)
    index, _ = index_of(t, g)
    clean = clean_rows(t, g)
    anchor = np.array([f"{u}{a}" for u, a in zip(index, t["anchor"], strict=True)], dtype=object)
    if name == "grpo":
        want = ref.compute_grpo_outcome_advantage(rewards, mask, index, t["traj"], group_by_agent_id=True)[0]
        ours_fn = lambda s, **kw: grpo(s, **kw)  # noqa: E731
    elif name == "rloo":
        want = ref.compute_rloo_outcome_advantage(rewards, mask, index, t["traj"], group_by_agent_id=True)[0]
        ours_fn = lambda s, **kw: rloo(s, **kw)  # noqa: E731
    elif name == "grpo_passk":
        ok = units_per_group(t, g) >= 2
        t, clean, anchor = subset(t, ok), clean[ok], anchor[ok]
        rewards, mask = tables(t)
        index, _ = index_of(t, g)
        want = ref.compute_grpo_passk_outcome_advantage(
            rewards, mask, index, t["traj"], group_by_agent_id=True
        )[0]
        ours_fn = lambda s, **kw: grpo_passk(s, **kw)  # noqa: E731
    else:
        step = torch.tensor(t["score"].astype(np.float64))
        want = ref.compute_gigpo_outcome_advantage(rewards, step, mask, anchor, index, t["traj"], mode="mean_std_norm",
                                                   group_by_agent_id=True)[0]  # fmt: skip
        ours_fn = lambda s, **kw: gigpo(s, anchor=kw.pop("anchor_"), **kw)  # noqa: E731
    want = ref.per_row(want, mask)
    kw = cols(t, g) | ({"anchor_": anchor} if name == "gigpo" else {})
    with pytest.warns(RuntimeWarning, match="non-finite score"):
        ours = ours_fn(t["score"].astype(np.float64), **kw)
    np.testing.assert_allclose(
        ours[clean], want[clean], atol=ATOL, rtol=0
    )  # rows of NaN-free groups coincide
    nan_rows = ~np.isfinite(t["score"].astype(np.float64))
    assert (
        np.isnan(want[~clean & ~nan_rows]).all() or name == "grpo_passk"
    )  # the reference: NaN for the group
    assert np.isfinite(ours).all() and (ours[nan_rows] == 0).all()
    # drmas's rows of those groups are what it gives the same table without the NaN rows
    keep = ~nan_rows
    kw_keep = {k: (v[keep] if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
    np.testing.assert_allclose(
        ours[keep], ours_fn(t["score"][keep].astype(np.float64), **kw_keep), atol=1e-12
    )


@pytest.mark.parametrize("name", ["reinforce_pp", "reinforce_pp_baseline"])
def test_nan_scores_poison_the_whole_reference_whitening_but_not_drmas(name):
    t = random_table(SEEDS[3], nan=True)
    s = t["score"].astype(np.float64)
    rewards, mask = tables(t)
    keep = np.isfinite(s)
    if name == "reinforce_pp":
        want = ref.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=1.0)[0]
        fn = lambda s, t: reinforce_pp(s, uid=t["uid"], agent_id=t["agent"], token_count=t["length"])  # noqa: E731
    else:
        index, _ = index_of(t, "prompt_agent")
        want = ref.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, index, t["traj"],
                                                                          group_by_agent_id=True)[0]  # fmt: skip
        fn = lambda s, t: reinforce_pp_baseline(s, **cols(t, "prompt_agent"), token_count=t["length"])  # noqa: E731
    assert torch.isnan(want[mask > 0]).all()
    with pytest.warns(RuntimeWarning, match="2 non-finite score"):
        ours = fn(s, t)
    np.testing.assert_allclose(ours[keep], fn(s[keep], subset(t, keep)), atol=1e-12)
    assert (ours[~keep] == 0).all()


# ---------------------------------------------------------------- the citations


CITED_LINES = {
    "verl/trainer/ppo/core_algos.py": {
        200: "def compute_gigpo_outcome_advantage(",
        237: "def episode_norm_reward(",
        306: "def build_step_group(",
        397: "def step_norm_reward(",
        431: "id2mean[idx] = torch.mean(torch.tensor(id2score[idx]))",  # a step group of one: its own mean
        497: "def compute_grpo_outcome_advantage(",
        554: "id2mean[idx] = torch.tensor(0.0)",  # GRPO's group of one: mean 0 ...
        555: "id2std[idx] = torch.tensor(1.0)",  # ... and std 1
        572: "def compute_grpo_passk_outcome_advantage(",
        620: "Pass@k requires at least 2 samples per group",
        634: "def compute_reinforce_plus_plus_baseline_outcome_advantage(",
        666: "id2mean[idx] = torch.tensor(0.0)",
        680: "def compute_rloo_outcome_advantage(",
        718: "scores[i] * response_num / (response_num - 1)",
        724: "def compute_reinforce_plus_plus_outcome_advantage(",
        751: "advantages = verl_F.masked_whiten(returns, response_mask)",
        757: "def compute_remax_outcome_advantage(",
        780: "advantages = returns - reward_baselines.unsqueeze(-1) * response_mask",
    },
    "verl/utils/torch_functional.py": {184: "whitened = (values - mean) * torch.rsqrt(var + 1e-8)"},
    "verl/trainer/ppo/ray_trainer.py": {
        223: "step_rewards[i] -= invalid_action_penalty_coef * action_invalids",
        271: 'group_index = np.array([f"{uid}_{agent_id}"',
        1195: 'gen_baseline_batch.meta_info["do_sample"] = False',
        1357: "batch = compute_advantage(",
    },
}


@pytest.mark.parametrize("path", sorted(CITED_LINES))
def test_the_cited_reference_lines_say_what_the_docstrings_claim(path):
    from fidelity.reference_mirror import reference_file

    lines = reference_file(path).splitlines()
    for number, text in CITED_LINES[path].items():
        assert text in lines[number - 1], f"{path}:{number} is {lines[number - 1].strip()!r}"
