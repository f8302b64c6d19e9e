"""The bounded group buffer: whole groups only, per-model staleness bound (drop), capacity with back-pressure;
a seeded property test over random interleavings and a simulated slow generator for one model."""

from __future__ import annotations

import threading
from collections import Counter, defaultdict

import numpy as np
import pytest

from drmas_train.collect.group_buffer import BufferClosed, BufferFull, GroupBuffer
from drmas_train.collect.samples import Sample


def _s(uid: str, traj: str, model: str, version: int = 0, agent: str = "a", turn: int = 0) -> Sample:
    return Sample(uid, traj, agent, model, turn, 0, [1], [2], [-1.0], [1], policy_version=version)


def test_a_group_is_released_only_when_complete_and_only_its_models_part():
    buf = GroupBuffer(2, {"m": None, "r": None}, capacity=4)
    e0 = [_s("u", "t0", "m"), _s("u", "t0", "r", agent="b"), _s("u", "t0", "frozen", agent="c")]
    e1 = [_s("u", "t1", "m")]  # no call of r in this episode
    buf.put("u", "t0", e0)
    assert buf.try_get("m", 0, 5) == [] and buf.try_get("r", 0, 5) == []  # half a group: nothing
    buf.put("u", "t1", e1)
    assert buf.try_get("m", 0, 5) == [[e0[0], e1[0]]]
    assert buf.held_groups() == 1  # r has not taken its part yet
    assert buf.try_get("r", 0, 5) == [[e0[1]]]
    assert buf.held_groups() == 0
    c = buf.counts()
    assert (c["m"].released_groups, c["m"].released_samples, c["r"].released_samples) == (1, 2, 1)
    assert "frozen" not in c


def test_input_errors_are_specific():
    with pytest.raises(ValueError, match="group_size and capacity must be >= 1"):
        GroupBuffer(0, {"m": 0}, 1)
    with pytest.raises(ValueError, match="max_staleness of 'm' must be an int >= 0 or None"):
        GroupBuffer(2, {"m": -1}, 1)
    buf = GroupBuffer(2, {"m": 0}, 4)
    with pytest.raises(ValueError, match=r"a sample of episode \('u', 'tX'\) put as episode \('u', 't0'\)"):
        buf.put("u", "t0", [_s("u", "tX", "m")])
    buf.put("u", "t0", [_s("u", "t0", "m")])
    with pytest.raises(ValueError, match="episode 't0' of group 'u' was put twice"):
        buf.put("u", "t0", [_s("u", "t0", "m")])
    buf.put("u", "t1", [_s("u", "t1", "m")])
    for held in (
        1,
        0,
    ):  # complete and held, then complete and taken: one more episode is a duplicate either way
        assert buf.held_groups() == held
        with pytest.raises(
            ValueError, match="group 'u' already had its 2 episodes; episode 't2' is one too many"
        ):
            buf.put("u", "t2", [_s("u", "t2", "m")])
        buf.try_get("m", 0, 1)
    with pytest.raises(KeyError, match="model 'x' is not trained through this buffer"):
        buf.try_get("x", 0, 1)
    buf.try_get("m", 3, 1)
    with pytest.raises(ValueError, match="trainer version of 'm' went back from 3 to 2"):
        buf.try_get("m", 2, 1)
    with pytest.raises(ValueError, match="must be >= 1, got 0"):
        buf.try_get("m", 3, 0)


def test_stale_groups_are_dropped_whole_and_counted():
    drops = []
    buf = GroupBuffer(2, {"m": 1}, 4, on_drop=lambda *a: drops.append(a))
    old = [
        _s("u", "t0", "m", version=0),
        _s("u", "t1", "m", version=2),
    ]  # one member 2 versions behind at v = 2
    fresh = [_s("w", "t2", "m", version=1), _s("w", "t3", "m", version=2)]
    for s in old + fresh:
        buf.put(s.uid, s.traj_uid, [s])
    assert buf.try_get("m", 2, 5) == [fresh]  # lag 1 <= 1 released; the old group dropped, not split
    assert drops == [("m", "u", old, 2)]
    c = buf.counts()["m"]
    assert (c.dropped_groups, c.dropped_samples, c.released_groups, c.released_samples) == (1, 2, 1, 2)
    assert buf.held_groups() == 0


def test_skip_keeps_the_newest_groups_of_a_busy_model_after_dropping_the_stale_ones():
    """Per-model pacing's backlog rule: the stale groups are dropped (as by a get), then all but the newest ``keep``
    complete ones skipped; the other model's parts stay, and a group's slot frees once every model is done with it."""
    seen = []
    buf = GroupBuffer(2, {"m": 1, "r": None}, 8, on_drop=lambda m, uid, part, v: seen.append((m, uid, v)))
    for k, (uid, version) in enumerate([("u0", 0), ("u1", 2), ("u2", 2), ("u3", 3)]):
        for j in range(2):
            buf.put(uid, f"t{k}{j}", [_s(uid, f"t{k}{j}", "m", version), _s(uid, f"t{k}{j}", "r", agent="b")])
    assert buf.skip("m", 3, keep=1) == 2  # u0 is 3 versions behind: dropped; u1, u2 skipped; u3 kept
    c = buf.counts()["m"]
    assert (c.dropped_groups, c.dropped_samples, c.skipped_groups, c.skipped_samples) == (1, 2, 2, 4)
    assert seen == [("m", "u0", 3), ("m", "u1", 3), ("m", "u2", 3)]
    assert [g[0].uid for g in buf.try_get("m", 3, 5)] == ["u3"]
    assert buf.held_groups() == 4  # r has not taken its parts
    assert [g[0].uid for g in buf.try_get("r", 0, 5)] == ["u0", "u1", "u2", "u3"]
    assert buf.held_groups() == 0
    assert buf.skip("m", 3, keep=1) == 0
    with pytest.raises(ValueError, match="must be >= 1, got 0"):
        buf.skip("m", 3, keep=0)
    state = buf.state_dict()
    restored = GroupBuffer(2, {"m": 1, "r": None}, 8)
    restored.load_state_dict(state)
    assert restored.counts() == buf.counts()


def test_capacity_back_pressure_never_blocks_an_open_group():
    buf = GroupBuffer(2, {"m": None}, capacity=1)
    buf.put("a", "a0", [_s("a", "a0", "m")])
    with pytest.raises(
        BufferFull, match="group buffer full \\(1 groups held\\); episode 'b0' of new group 'b'"
    ):
        buf.put("b", "b0", [_s("b", "b0", "m")], timeout=0)
    buf.put("a", "a1", [_s("a", "a1", "m")], timeout=0)  # its slot is taken: no wait
    with pytest.raises(BufferFull):  # complete but not yet taken: still held
        buf.put("b", "b0", [_s("b", "b0", "m")], timeout=0)
    done = threading.Event()

    def producer():
        buf.put("b", "b0", [_s("b", "b0", "m")], timeout=30)  # waits for the consumer below
        done.set()

    t = threading.Thread(target=producer)
    t.start()
    assert len(buf.try_get("m", 0, 1)) == 1  # frees the slot: the waiting put goes in
    t.join(30)
    assert done.is_set() and buf.held_groups() == 1


def test_get_waits_for_whole_batches_times_out_and_closes():
    buf = GroupBuffer(1, {"m": None}, capacity=8)
    buf.put("a", "a0", [_s("a", "a0", "m")])
    with pytest.raises(TimeoutError, match="1 of 2 groups of model 'm' ready after 0.01 s"):
        buf.get("m", 0, 2, timeout=0.01)
    got = []
    t = threading.Thread(target=lambda: got.append(buf.get("m", 0, 2, timeout=30)))
    t.start()
    buf.put("b", "b0", [_s("b", "b0", "m")])
    t.join(30)
    assert [[s.uid for s in g] for g in got[0]] == [["a"], ["b"]]  # nothing was taken by the timed-out call
    errors = []

    def waiter():
        try:
            buf.get("m", 0, 1, timeout=30)
        except BufferClosed as err:
            errors.append(err)

    t = threading.Thread(target=waiter)
    t.start()
    buf.close()
    t.join(30)
    assert len(errors) == 1
    with pytest.raises(BufferClosed):
        buf.put("c", "c0", [])


@pytest.mark.parametrize("seed", range(12))
def test_property_random_interleavings(seed):
    """Random episodes (calls of two trained models and a frozen one, versions up to 3 behind), random order,
    random consumer calls with growing versions, small capacity: no partial group, none beyond its bound at
    release, every model part of every group released or dropped exactly once, counts exact."""
    rng = np.random.default_rng(seed)
    G, U = int(rng.integers(1, 4)), int(rng.integers(3, 9))
    eta = {"m": [0, 1, 2, None][int(rng.integers(4))], "r": [0, 1, 2, None][int(rng.integers(4))]}
    capacity = int(rng.integers(1, 4))
    drops: list[tuple] = []
    buf = GroupBuffer(G, eta, capacity, on_drop=lambda *a: drops.append(a))
    version = {"m": 0, "r": 0}
    episodes = [(f"u{u}", f"u{u}-t{g}") for u in range(U) for g in range(G)]
    order = [episodes[i] for i in rng.permutation(len(episodes))]
    expected: dict[tuple[str, str], list[int]] = defaultdict(list)  # (uid, model) -> ids of its samples
    arrived: Counter[str] = Counter()
    released: list[tuple[str, str, list[Sample], int]] = []
    pending = list(order)

    def make(uid, traj):
        out = []
        for k in range(int(rng.integers(0, 4))):
            model = ["m", "r", "frozen"][int(rng.integers(3))]
            v = max(version.get(model, 0) - int(rng.integers(0, 4)), 0)
            out.append(_s(uid, traj, model, version=v, turn=k))
        return out

    def consume(model):
        version[model] += int(rng.integers(0, 2))
        for part in buf.try_get(model, version[model], int(rng.integers(1, 4))):
            released.append((part[0].uid, model, part, version[model]))

    while pending:
        if rng.random() < 0.6:
            uid, traj = pending[0]
            samples = make(uid, traj)
            try:
                buf.put(uid, traj, samples, timeout=0)
            except (
                BufferFull
            ):  # back-pressure: finish a group already open (the rule that cannot deadlock) ...
                open_next = [i for i, (u, _) in enumerate(pending) if 0 < arrived[u] < G]
                if open_next:
                    pending.insert(0, pending.pop(open_next[0]))
                else:  # ... or let a consumer take the complete ones
                    consume(["m", "r"][int(rng.integers(2))])
                continue
            pending.pop(0)
            arrived[uid] += 1
            for s in samples:
                if s.model_id in eta:
                    expected[(uid, s.model_id)].append(id(s))
        else:
            consume(["m", "r"][int(rng.integers(2))])
        assert buf.held_groups() <= capacity
        for uid, _, _, _ in released:
            assert arrived[uid] == G  # no part of an incomplete group ever left the buffer
    for model in ("m", "r"):  # drain at the final versions
        for part in buf.try_get(model, version[model], 10**6):
            released.append((part[0].uid, model, part, version[model]))

    outcome = Counter()
    for uid, model, part, v in released:
        assert sorted(id(s) for s in part) == sorted(expected[(uid, model)])  # the whole part: never partial
        assert eta[model] is None or v - min(s.policy_version for s in part) <= eta[model]
        outcome[(uid, model)] += 1
    for model, uid, part, v in drops:
        assert sorted(id(s) for s in part) == sorted(expected[(uid, model)])
        assert v - min(s.policy_version for s in part) > eta[model]
        outcome[(uid, model)] += 1
    assert outcome == Counter(expected.keys())  # each model part of each group: released or dropped, once
    counts = buf.counts()
    for model in ("m", "r"):
        assert counts[model].dropped_samples == sum(len(p) for m, _, p, _ in drops if m == model)
        assert counts[model].dropped_groups == sum(1 for m, *_ in drops if m == model)
        assert counts[model].released_samples == sum(len(p) for _, m, p, _ in released if m == model)
        total = sum(len(ids) for (u, m), ids in expected.items() if m == model)
        assert counts[model].released_samples + counts[model].dropped_samples == total
    assert buf.held_groups() == 0


def _simulate(eta: int | None, *, workers: int = 6, slow_ticks: int = 20, every: int = 3, batch: int = 1,
              capacity: int = 4, ticks: int = 5000) -> dict:  # fmt: skip
    """A deterministic step schedule (no clock): ``workers`` generation workers play episodes of a two-call team,
    the ``slow`` model's call taking ``slow_ticks`` ticks in every ``every``-th episode (1 otherwise), then the
    ``fast`` model's call (1 tick). A call is stamped with its model's trainer version when it starts (the weights
    the worker holds). Each model's trainer takes groups as they are ready and updates (version + 1) once it holds
    ``batch`` groups."""
    G, U, B = 2, 24, batch
    buf = GroupBuffer(G, {"slow": eta, "fast": eta}, capacity=capacity)
    version = {"slow": 0, "fast": 0}
    held: dict[str, list[list[Sample]]] = {"slow": [], "fast": []}
    consumed: dict[str, list[int]] = {"slow": [], "fast": []}  # staleness of every consumed sample
    queue = [(f"u{u}", f"u{u}-t{g}", (u * G + g) % every == 0) for u in range(U) for g in range(G)]
    slots: list[dict | None] = [None] * workers
    blocked = 0
    for _ in range(ticks):
        for w, job in enumerate(slots):
            if job is None and queue:
                uid, traj, long = queue.pop(0)
                job = slots[w] = {
                    "uid": uid,
                    "traj": traj,
                    "samples": [],
                    "left": slow_ticks if long else 1,
                    "stage": 0,
                }
                job["samples"].append(_s(uid, traj, "slow", version["slow"], agent="router"))
            if job is None:
                continue
            job["left"] -= 1
            if job["left"] > 0:
                continue
            if job["stage"] == 0:  # the slow call is done: the fast model's call starts
                job["stage"], job["left"] = 1, 1
                job["samples"].append(
                    _s(job["uid"], job["traj"], "fast", version["fast"], agent="answer", turn=1)
                )
                continue
            try:
                buf.put(job["uid"], job["traj"], job["samples"], timeout=0)
                slots[w] = None
            except BufferFull:  # back-pressure: the worker holds its episode and retries next tick
                job["left"] = 1
                blocked += 1
        for model in ("slow", "fast"):
            held[model] += buf.try_get(model, version[model], B - len(held[model]))
            if len(held[model]) == B:  # the update: it consumes its samples at its current version
                consumed[model] += [version[model] - s.policy_version for g in held[model] for s in g]
                held[model] = []
                version[model] += 1
        if not queue and all(w is None for w in slots) and buf.held_groups() == 0:
            break
    else:
        raise AssertionError("the simulation did not finish")
    return {"consumed": consumed, "counts": buf.counts(), "blocked": blocked, "version": version}


def test_slow_generator_for_one_model_never_feeds_an_update_beyond_its_bound():
    unbounded = _simulate(None)  # the schedule without a bound: how stale the consumed samples get
    lags = unbounded["consumed"]
    assert max(lags["slow"]) > 1 and np.mean(lags["slow"]) > np.mean(
        lags["fast"]
    )  # the slow model's calls: stalest
    assert unbounded["counts"]["slow"].dropped_groups == 0
    bounded = _simulate(1)
    for model in ("slow", "fast"):
        assert (
            bounded["consumed"][model] and max(bounded["consumed"][model]) <= 1
        )  # the bound holds at every update
        c = bounded["counts"][model]
        assert c.dropped_groups > 0 and c.released_groups + c.dropped_groups == 24  # each group: one fate
        assert c.dropped_samples == 2 * c.dropped_groups  # whole groups (2 episodes x 1 call of the model)
    assert bounded["blocked"] > 0  # the capacity pushed back on the generators


def test_state_round_trip_continues_as_the_original():
    """A buffer with a complete group half taken (r took its part, m not), a complete one untaken and an open one,
    saved and loaded into a fresh buffer, then driven the same way as the original: the same groups, drops, counts
    and duplicate check."""

    def fill() -> GroupBuffer:
        buf = GroupBuffer(2, {"m": 1, "r": None}, capacity=4)
        for uid, v in (("old", 0), ("u", 2)):
            for g in range(2):
                buf.put(
                    uid,
                    f"{uid}/{g}",
                    [_s(uid, f"{uid}/{g}", "m", v), _s(uid, f"{uid}/{g}", "r", v, agent="b")],
                )
        buf.put("open", "open/0", [_s("open", "open/0", "m", 2)])
        assert len(buf.try_get("r", 2, 1)) == 1  # r takes "old"
        return buf

    original, restored = fill(), GroupBuffer(2, {"m": 1, "r": None}, capacity=4)
    restored.load_state_dict(original.state_dict())
    assert restored.held_groups() == original.held_groups() == 3
    for buf in (original, restored):
        buf.put("open", "open/1", [_s("open", "open/1", "m", 2)])
    assert restored.try_get("m", 2, 5) == original.try_get(
        "m", 2, 5
    )  # "old" dropped (2 behind), "u", "open" taken
    assert vars(restored.counts()["m"]) == vars(original.counts()["m"]) == {
        "released_groups": 2, "released_samples": 4, "dropped_groups": 1, "dropped_samples": 2,
        "skipped_groups": 0, "skipped_samples": 0,
    }  # fmt: skip
    with pytest.raises(ValueError, match="episode 'open/1' is one too many|already had its 2 episodes"):
        restored.put("open", "open/1", [])
    with pytest.raises(ValueError, match="needs an empty group buffer"):
        restored.load_state_dict(original.state_dict())
