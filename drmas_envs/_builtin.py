"""Registers every built-in env (imported by ``drmas_envs/__init__.py``). One line per env id."""

from drmas_envs.registration import register

# Math (drmas_envs/math/)
register("math-solver-v0", "drmas_envs.math.solver:env")
register("math-solver-verifier-v0", "drmas_envs.math.solver_verifier:env")
register("math-generator-verifier-refiner-v0", "drmas_envs.math.generator_verifier_refiner:env")
# Search (drmas_envs/search/)
register("search-orchestrator-v0", "drmas_envs.search.orchestrator:env")
register("search-r1-v0", "drmas_envs.search.search_r1:env")
# Games (drmas_envs/games/, optional extra "games": OpenSpiel)
register("openspiel/kuhn_poker-v0", "drmas_envs.games.kuhn_poker:env")
register("openspiel/leduc_poker-v0", "drmas_envs.games.leduc_poker:env")
register("openspiel/liars_dice-v0", "drmas_envs.games.liars_dice:env")
register("openspiel/tic_tac_toe-v0", "drmas_envs.games.tic_tac_toe:env")
register("openspiel/connect_four-v0", "drmas_envs.games.connect_four:env")
_ = register
