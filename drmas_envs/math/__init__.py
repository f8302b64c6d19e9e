"""Math envs (floor 3 of drmas_envs, over ``core`` and ``data``): ``math-solver-v0`` (:mod:`.solver`),
``math-solver-verifier-v0`` (:mod:`.solver_verifier`) and ``math-generator-verifier-refiner-v0``
(:mod:`.generator_verifier_refiner`), their prompts (:mod:`.prompts`) and graders (:mod:`.grading`, :mod:`.graders`).
"""
