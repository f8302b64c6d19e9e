"""Registers every built-in env (imported by ``drmas_envs/__init__.py``). One line per env id."""

from drmas_envs.registration import register

# Math (drmas_envs/math/)
# register("math-solver-v0", "drmas_envs.math.solver:env")
# Search (drmas_envs/search/)
_ = register
