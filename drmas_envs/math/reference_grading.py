r"""The Dr. MAS reference's math reward as a drmas grader (``grader="reference"``, the math envs' default).

What the reference rewards (``langfengQ/DrMAS agent_system/environments/env_package/math/math_reward.py:39-107``,
called once per episode on the last Solver reply, ``envs.py:22-31``):

1. **Graded text**: an empty reply scores 0 (``:56-58``); otherwise the text *after the first* ``</think>`` and
   before a second one (``response.split("</think>")[1]``, ``:61-62``), or the whole reply when it has none
   (``:63-66``; the reference's ``apply_format_reward`` is off).
2. **Answer**: the content of the *last* ``\boxed`` of that text, which must be followed directly by ``{`` and
   closed (balanced braces; ``utils.py:393-435,485-488``): ``\fbox{..}`` and a brace-less ``\boxed 2`` are no
   answer (reward 0), an empty ``\boxed{}`` is the answer ``""`` (graded, never correct).
3. **Ground truths**: a ground truth holding ``\boxed`` is replaced by its box content (``:82-90``).
4. **Equivalence**: :func:`drmas_envs.math.reference_equivalence.equivalent` (mathd normaliser, else sympy),
   against each ground truth in turn (``:96-105``). Reward 1 if equal, else 0.

**Validity** (``is_action_valid``, the format penalty) is the reference Solver's ``math_projection``
(``agent_system/agent/utils.py:214-244``, ``check_think_tag=False`` at ``agents/math/solver_agent.py:56``): the
*whole* reply has a last ``\boxed{...}`` as in step 2, so an empty ``\boxed{}`` is valid and ``\fbox{1}`` is not.
(The reward reads the text after ``</think>``, validity the whole reply: a box only inside the thinking is valid
and scores 0, as in the reference.)

Differences, all on pathological input: the equivalence check runs in drmas's bounded worker (default 1 s and
1 GiB per check; the reference's has no limit), so an answer whose check exceeds the limit scores 0
(``timeout``); an answer over ``max_answer_chars`` (default 1,000) scores 0 (``too_long``) without a check.

    >>> from drmas_envs.math.reference_grading import ReferenceGrader, reference_boxed
    >>> reference_boxed(r"\boxed{\frac{1}{2}}"), reference_boxed(r"\fbox{3}"), reference_boxed(r"\boxed 2")
    ('\\frac{1}{2}', None, None)
    >>> ReferenceGrader().grade(r"<think>maybe \boxed{4}</think> so \boxed{\dfrac{1}{2}}", "0.5").correct
    True
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from drmas_envs.math.grading import MathGrader, scan_last_box

__all__ = ["ReferenceGrader", "reference_boxed", "graded_segment", "THINK_END"]

#: The reference's end-of-thinking delimiter (``math_reward.py:11``).
THINK_END = "</think>"
_BOXED = ("\\boxed",)


def graded_segment(response: str) -> str:
    """The part of ``response`` the reference grades: between the first and the second ``</think>`` (to the end
    when there is one), or the whole response without one (``math_reward.py:61-66``)."""
    return response.split(THINK_END, 2)[1] if THINK_END in response else response


def reference_boxed(text: str) -> str | None:
    r"""The reference's ``extract_answer`` (``utils.py:393-435,485-488``): the content of the last ``\boxed`` when
    ``{`` follows it directly and its braces close; else ``None``. ``\fbox`` is never read.

    Raises:
        TypeError: ``text`` is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f"reference_boxed expects a str, got {type(text).__name__}")
    return scan_last_box(text, markers=_BOXED, braceless=False)[0]


@dataclasses.dataclass
class ReferenceGrader(MathGrader):
    """The reference's reward and validity rule (module docstring), equivalence in the bounded worker.

    Args: as :class:`~drmas_envs.math.grading.MathGrader` (``timeout_s``, ``max_answer_chars``,
    ``exact_shortcut``: an answer identical to a ground truth after ``strip`` is correct without the worker,
    which the reference's mathd normaliser also concludes; ``worker``: backend ``"reference"``).
    """

    name: ClassVar[str] = "reference"
    backend: ClassVar[str] = "reference"
    verbatim: ClassVar[bool] = True

    def extract(self, text: str) -> str | None:
        """The last ``\\boxed{...}`` of the whole reply, as the validity rule reads it (:func:`reference_boxed`)."""
        return reference_boxed(text)

    def is_valid(self, text: str) -> bool:
        """The reference Solver's ``math_projection``: the whole reply has a readable last box, even empty."""
        return reference_boxed(text) is not None

    def graded_answer(self, response: str) -> tuple[str | None, bool]:
        """The last box of :func:`graded_segment`; ``(None, True)`` when it is still open after
        ``max_answer_chars``."""
        return scan_last_box(graded_segment(response), self.max_answer_chars, markers=_BOXED, braceless=False)

    def ground_truths(self, golds: tuple[str, ...]) -> tuple[str, ...]:
        """Boxed ground truths replaced by their content, unreadable boxed ones dropped (``math_reward.py:82-90``)."""
        out = []
        for gold in golds:
            if "\\boxed" in gold:
                inner = reference_boxed(gold)
                if inner is None:
                    continue
                gold = inner
            out.append(gold)
        return tuple(out)
