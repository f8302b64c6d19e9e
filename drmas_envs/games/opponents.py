"""Fixed opponents of the :mod:`drmas_envs.games` envs: named, versioned, seeded by the env's own ``np_random``.

An opponent plays every seat but the learner's, inside the env's step, so only the learning agent acts in the AEC
loop. Each is a pure function of (OpenSpiel state, the env's ``np_random``): the same seed gives the same moves in
every process. A new version (``-v1``) is added whenever its play would change; an old version never changes, so
results that name one stay comparable.

=============  ==================================================================================  =============
name           policy                                                                              games
=============  ==================================================================================  =============
``random-v0``  uniform over the legal actions (``np_random.integers``)                             all
``mcts-v0``    OpenSpiel's C++ ``MCTSBot``: UCT c = 2, :data:`MCTS_SIMULATIONS` simulations, one   perfect
               random rollout per leaf (``RandomRolloutEvaluator``), ``solve=True``; its seed is   information
               drawn from ``np_random`` at each move (each move is a fresh search)
``cfr-v0``     the average policy of OpenSpiel's C++ CFR+ solver (Tammelin 2014, arXiv 1407.5042)  2-player,
               after :data:`CFR_ITERATIONS` iterations, computed once per game per process and     small trees
               cached; a move is sampled from it with ``np_random`` (exploitability: Kuhn 0.0012,  (Kuhn, Leduc)
               Leduc 0.013 chips)
=============  ==================================================================================  =============
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import pyspiel

__all__ = ["OPPONENTS", "MCTS_SIMULATIONS", "CFR_ITERATIONS", "opponent_action", "cfr_policy"]

#: Simulations per move of ``mcts-v0``.
MCTS_SIMULATIONS = 200
#: CFR+ iterations of ``cfr-v0``.
CFR_ITERATIONS = 100

OpponentFn = Callable[[pyspiel.State, np.random.Generator], int]


def _random(state: pyspiel.State, rng: np.random.Generator) -> int:
    legal = state.legal_actions()
    return int(legal[int(rng.integers(len(legal)))])


def _mcts(state: pyspiel.State, rng: np.random.Generator) -> int:
    seed = int(rng.integers(2**31 - 1))
    evaluator = pyspiel.RandomRolloutEvaluator(1, seed)
    bot = pyspiel.MCTSBot(state.get_game(), evaluator, 2.0, MCTS_SIMULATIONS, 64, True, seed, False)
    return int(bot.step(state))


@functools.lru_cache(maxsize=8)
def _cfr_solver(game_name: str) -> pyspiel.CFRPlusSolver:
    solver = pyspiel.CFRPlusSolver(pyspiel.load_game(game_name))
    for _ in range(CFR_ITERATIONS):
        solver.evaluate_and_update_policy()
    return solver


def cfr_policy(game_name: str) -> pyspiel.Policy:
    """The CFR+ average policy of ``game_name`` after :data:`CFR_ITERATIONS` iterations (solved once per process).

    Takes about 1 s for Leduc poker on one core, milliseconds for Kuhn poker. The solver stays cached: the C++
    average policy reads the solver's tables, so it must not outlive it (a freed solver crashes the process).
    """
    return _cfr_solver(game_name).average_policy()


def _cfr(state: pyspiel.State, rng: np.random.Generator) -> int:
    actions, probs = zip(*cfr_policy(state.get_game().get_type().short_name).get_state_policy(state), strict=True)
    p = np.asarray(probs, dtype=np.float64)
    return int(actions[int(rng.choice(len(actions), p=p / p.sum()))])


#: name -> move function ``(state, np_random) -> action id``.
OPPONENTS: dict[str, OpponentFn] = {"random-v0": _random, "mcts-v0": _mcts, "cfr-v0": _cfr}


def opponent_action(name: str, state: pyspiel.State, rng: np.random.Generator) -> int:
    """The move of opponent ``name`` (a key of :data:`OPPONENTS`) in ``state``, drawing randomness from ``rng``.

    Raises:
        ValueError: unknown ``name`` (the message lists the accepted ones).
    """
    if name not in OPPONENTS:
        raise ValueError(f"unknown opponent {name!r}; accepted: {', '.join(sorted(OPPONENTS))}")
    return OPPONENTS[name](state, rng)
