"""The named math graders the math envs select with ``grader=``.

========================  =====================================================================================
``"reference"`` (default)  the Dr. MAS reference's reward: text after the first ``</think>``, last ``\\boxed{}``
                           only, normalise-then-sympy equivalence; valid iff the reply has a readable last
                           ``\\boxed{...}`` (:class:`~drmas_envs.math.reference_grading.ReferenceGrader`)
``"math_verify"``          the whole reply, last ``\\boxed{}`` / ``\\fbox{}`` (also ``\\boxed 5``), math-verify
                           equivalence; valid iff that box is non-blank (:class:`~drmas_envs.math.grading.MathGrader`)
========================  =====================================================================================

Both check equivalence in the same bounded worker (time and memory limits, :mod:`drmas_envs.math.grading`).
``benchmarks/grading_agreement.py`` measures where they disagree (``docs/fidelity.md``).
"""

from __future__ import annotations

from typing import Any

from drmas_envs.math.grading import MathGrader
from drmas_envs.math.reference_grading import ReferenceGrader

__all__ = ["GRADERS", "DEFAULT_GRADER", "make_grader"]

#: name -> grader class; the first is the math envs' default.
GRADERS: dict[str, type[MathGrader]] = {"reference": ReferenceGrader, "math_verify": MathGrader}
DEFAULT_GRADER = "reference"


def make_grader(name: str = DEFAULT_GRADER, **kwargs: Any) -> MathGrader:
    """The grader called ``name`` with ``kwargs`` (``timeout_s``, ``max_answer_chars``, ``exact_shortcut``,
    ``worker``).

    Raises:
        ValueError: unknown ``name`` (lists the accepted ones), or the grader's own argument errors.
    """
    if name not in GRADERS:
        raise ValueError(f"grader must be one of {tuple(GRADERS)}, got {name!r}")
    return GRADERS[name](**kwargs)
