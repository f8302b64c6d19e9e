r"""Answer equivalence as the Dr. MAS reference decides it: a Hendrycks-MATH string normaliser, then sympy.

This is the comparison behind the reference's math reward (``langfengQ/DrMAS
agent_system/environments/env_package/math/math_reward.py:96-97``): an answer equals a ground truth when

1. **mathd**: both sides are equal after the MATH dataset's string normaliser (:func:`mathd_normalize`,
   ``agent_system/environments/env_package/math/utils.py:29-178,475-482``), or
2. **sympy**: both sides are equal after a second normaliser (:func:`sympy_normalize`, pylatexenc's
   LaTeX-to-text among others, ``utils.py:269-339``), or, element by element for tuples and intervals, when
   sympy simplifies their difference to 0 (``utils.py:365-376,438-472``), with the reference's rules: a fraction
   ``a/b`` must match literally, an integer never matches a non-integer, and only expressions with at most two
   distinct letters and no ``^{``, ``^(``, ``^12`` or ``^2^`` are handed to sympy (``utils.py:181-183,349-362``).

Behaviour is the reference's, quirks included (e.g. ``1,999.99999999`` normalises to ``1999``, truncated:
``utils.py:233-245,336-337``). ``tests/drmas_envs/math/test_reference_grading.py`` holds goldens computed with the reference;
``tests/fidelity/test_math_reward_fidelity.py`` runs the reference's own ``utils.py`` beside this module on held-out
inputs.

**Not for the calling process.** :func:`sympy_equal` parses text with ``sympy.parsing.sympy_parser.parse_expr``,
which evaluates Python, and ``sympy.simplify`` may run for minutes on an adversarial answer. drmas runs
:func:`equivalent` only inside the bounded worker of :mod:`drmas_envs.math.grading` (capped address space, the
process killed at the per-call time limit), which imports this file as a sibling module; nothing in this module
imports the rest of drmas. The reference's letter gate (at most two distinct letters) is what keeps Python names
out of ``parse_expr``; the worker bounds the rest.

Requires ``sympy`` and ``pylatexenc`` (as the reference: ``setup.py``, ``requirements.txt``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = [
    "mathd_normalize",
    "hendrycks_strip",
    "mathd_equal",
    "sympy_normalize",
    "sympy_equal",
    "equivalent",
    "equivalent_any",
]

_TEXT_WRAPPER = re.compile(r"^\\text\{(?P<text>.+?)\}")
_INT_COMMAS = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_MIXED_NUMBER = re.compile("([0-9]) +([0-9])")
_FRACTION = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
# utils.py:290-307: unit words removed (with plural endings and an optional power) before sympy
_UNITS = tuple(
    re.compile(rf"{unit}(es)?(s)? *(\^[0-9]+)?")
    for unit in ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week",
                 "month", "year", "foot", "feet", "inch", "yard")
)  # fmt: skip
_TUPLE_CHARS = "()[]"
# utils.py:181-183: inputs on which sympy "might hang" are not evaluated at all
_SYMPY_UNSAFE_SUBSTRINGS = ("^{", "^(")
_SYMPY_UNSAFE_PATTERNS = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))


# ---- 1. mathd: the MATH dataset's normaliser (utils.py:29-178) ---------------------------------------------


def _braced_fractions(s: str) -> str:
    r"""``\frac12`` -> ``\frac{1}{2}``, ``\frac1{72}`` -> ``\frac{1}{72}`` (utils.py:45-74).

    Raises IndexError on a ``\frac`` at the very end, as the reference does (its caller then keeps the answer).
    """
    head, *rest = s.split("\\frac")
    out = [head]
    for part in rest:
        out.append("\\frac")
        if part[0] == "{":
            out.append(part)
        elif len(part) < 2:
            return s
        elif part[1] != "{":
            out.append("{" + part[0] + "}{" + part[1] + "}" + part[2:])
        else:
            out.append("{" + part[0] + "}" + part[1:])
    return "".join(out)


def _slash_to_fraction(s: str) -> str:
    r"""``3/4`` -> ``\frac{3}{4}`` when both sides are plain ints written canonically (utils.py:76-88)."""
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def _braced_roots(s: str) -> str:
    r"""``\sqrt3`` -> ``\sqrt{3}`` (utils.py:99-111); IndexError on a ``\sqrt`` at the very end."""
    if "\\sqrt" not in s:
        return s
    head, *rest = s.split("\\sqrt")
    return head + "".join(
        "\\sqrt" + part if part[0] == "{" else "\\sqrt{" + part[0] + "}" + part[1:] for part in rest
    )


def hendrycks_strip(s: str) -> str:
    r"""The MATH dataset's answer canonicaliser, step for step as ``utils.py:113-178`` applies it.

    Raises:
        ValueError: more than one ``"\text{ "`` (the reference's assert, ``utils.py:92-95``); IndexError: a trailing ``\frac`` or
        ``\sqrt``. :func:`mathd_normalize` catches both, as the reference does.
    """
    for old, new in (
        ("\n", ""),
        ("\\!", ""),
        ("\\\\", "\\"),
        ("tfrac", "frac"),
        ("dfrac", "frac"),
        ("\\left", ""),
        ("\\right", ""),
        ("^{\\circ}", ""),
        ("^\\circ", ""),
        ("\\$", ""),
    ):
        s = s.replace(old, new)
    if "\\text{ " in s:  # units on the right (utils.py:90-97)
        head, *tail = s.split("\\text{ ")
        if len(tail) != 1:
            raise ValueError("more than one unit")  # the reference's assert (utils.py:94)
        s = head
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "k = 3" -> "3"
        s = sides[1]
    s = _braced_roots(s).replace(" ", "")
    s = _braced_fractions(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _slash_to_fraction(s)


def mathd_normalize(answer: str | None) -> str | None:
    r"""``answer`` stripped, a leading ``\text{...}`` unwrapped, then :func:`hendrycks_strip`; on an error of the
    latter, the answer as it was before it (``utils.py:30-41``). ``None`` stays ``None``."""
    if answer is None:
        return None
    answer = answer.strip()
    try:
        m = _TEXT_WRAPPER.search(answer)
        if m is not None:
            answer = m.group("text").strip()
        return hendrycks_strip(answer)
    except Exception:  # noqa: BLE001 - the reference keeps the answer on any normaliser error
        return answer


def mathd_equal(given: str, ground_truth: str) -> bool:
    """Equal after :func:`mathd_normalize` (``utils.py:475-482``)."""
    return mathd_normalize(ground_truth) == mathd_normalize(given)


# ---- 2. sympy: a second normaliser, then simplify(a - b) == 0 (utils.py:181-472) ----------------------------


def _latex_to_text(expr: str) -> str:
    """pylatexenc's LaTeX-to-text with the reference's symbol replacements (``utils.py:196-211``)."""
    from pylatexenc import latex2text

    expr = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")
    expr = latex2text.LatexNodes2Text().latex_to_text(expr)
    for old, new in (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*")):
        expr = expr.replace(old, new)
    return expr.strip()


def _is_float(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _is_int(x: float) -> bool:
    try:
        return abs(x - int(round(x))) <= 1e-7
    except Exception:  # noqa: BLE001 - inf / nan
        return False


def _strip_int_commas(s: str) -> str:
    """``1,000,000`` -> ``1000000``, leaving tuple commas (``utils.py:258-266``)."""
    while True:
        stripped = _INT_COMMAS.sub("\\1\\3\\4", s)
        if stripped == s:
            return s
        s = stripped


def _str_is_int(s: str) -> bool:
    """Within 1e-7 of an integer once thousands separators are dropped (``utils.py:233-239``)."""
    try:
        x = float(_strip_int_commas(s))
        return abs(x - int(round(x))) <= 1e-7
    except Exception:  # noqa: BLE001
        return False


def _str_to_int(s: str) -> int:
    """``int(float(s without commas))``: truncation, so ``1,999.99999999`` gives 1999 (``utils.py:242-245``)."""
    return int(float(s.replace(",", "")))


def sympy_normalize(expr: str | None) -> str | None:
    """The reference's second normaliser (``utils.py:269-339``): units, words, LaTeX to text, spaces, braces and
    case removed; integers canonical. ``None`` stays ``None``."""
    if expr is None:
        return None
    m = _TEXT_WRAPPER.search(expr)
    if m is not None:
        expr = m.group("text")
    for old, new in (
        ("\\%", "%"),
        ("\\$", "$"),
        ("$", ""),
        ("%", ""),
        (" or ", " , "),
        (" and ", " , "),
        ("million", "*10^6"),
        ("billion", "*10^9"),
        ("trillion", "*10^12"),
    ):
        expr = expr.replace(old, new)
    for unit in _UNITS:  # one unit at a time, in the reference's order
        expr = unit.sub("", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    if _is_float(expr) and _is_int(float(expr)):
        expr = str(int(round(float(expr))))
    if "\\" in expr:
        try:
            expr = _latex_to_text(expr)
        except Exception:  # noqa: BLE001 - the reference keeps the text when pylatexenc fails
            pass
    expr = re.sub("- *", "-", expr)
    expr = _MIXED_NUMBER.sub("\\1+\\2", expr)  # "7 3/4" -> "7+3/4"
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _str_is_int(expr):
        expr = str(_str_to_int(expr))
    return expr


def _sympy_allowed(expr: str) -> bool:
    """At most two distinct letters (``sqrt``/``frac`` aside) and none of the inputs on which sympy may hang
    (``utils.py:342-362``)."""
    letters = {c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    if len(letters) > 2:
        return False
    if any(bad in expr for bad in _SYMPY_UNSAFE_SUBSTRINGS):
        return False
    return not any(p.search(expr) for p in _SYMPY_UNSAFE_PATTERNS)


def _sympy_zero_difference(ground_truth: str, given: str) -> bool:
    """``simplify((gt) - (given)) == 0`` with implicit multiplication, ``^`` read as power (``utils.py:187-193,
    365-376``); False on any error or when :func:`_sympy_allowed` refuses the text."""
    import sympy
    from sympy.parsing import sympy_parser

    expr = f"({ground_truth})-({given})"
    try:
        if not _sympy_allowed(expr):
            return False
        transformations = sympy_parser.standard_transformations + (
            sympy_parser.implicit_multiplication_application,
        )
        difference = sympy_parser.parse_expr(expr.replace("^", "**"), transformations=transformations)
        return bool(sympy.simplify(difference) == 0)
    except Exception:  # noqa: BLE001 - any parse / simplify failure is "not equal", as in the reference
        return False


def _split_tuple(expr: str) -> list[str]:
    """Elements of ``(a,b)`` / ``[a,b)`` ..., else ``[expr]``; ``[]`` for an empty string (``utils.py:379-390``)."""
    expr = _strip_int_commas(expr)
    if not expr:
        return []
    if (
        len(expr) > 2
        and expr[0] in _TUPLE_CHARS
        and expr[-1] in _TUPLE_CHARS
        and not any(c in expr[1:-1] for c in _TUPLE_CHARS)
    ):
        return [e.strip() for e in expr[1:-1].split(",")]
    return [expr]


def sympy_equal(given: str, ground_truth: str) -> bool:
    """The reference's ``grade_answer_sympy`` (``utils.py:438-472``): equal normalised strings, or the same
    bracket shape and every element pair equal (fractions literally, integers only to integers, else sympy)."""
    truth, answer = sympy_normalize(ground_truth), sympy_normalize(given)
    if truth is None:
        return False
    if truth == answer:
        return True
    if not answer:
        return False
    truth_elems, answer_elems = _split_tuple(truth), _split_tuple(answer)
    if len(truth_elems) > 1 and (truth[0] != answer[0] or truth[-1] != answer[-1]):
        return False
    if len(truth_elems) != len(answer_elems):
        return False
    for t, a in zip(truth_elems, answer_elems, strict=True):
        if _FRACTION.search(t) and _FRACTION.search(a):
            ok = t == a  # unreduced fractions must not match through simplify
        elif _str_is_int(t) != _str_is_int(a):
            ok = False
        else:
            ok = _sympy_zero_difference(t, a)
        if not ok:
            return False
    return True


def equivalent(given: str, ground_truth: str) -> bool:
    """mathd or sympy equality of one answer and one ground truth (``math_reward.py:97``)."""
    return mathd_equal(given, ground_truth) or sympy_equal(given, ground_truth)


def equivalent_any(given: str, ground_truths: Sequence[str]) -> bool:
    """:func:`equivalent` to at least one ground truth, tried in order (``math_reward.py:96-107``)."""
    return any(equivalent(given, truth) for truth in ground_truths)
