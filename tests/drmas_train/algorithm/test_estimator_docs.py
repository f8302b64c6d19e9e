"""The estimator list is the registry's: every doc that lists the advantage estimators lists exactly
:data:`drmas_train.algorithm.advantages.ESTIMATORS` (and, where it gives them, their default groupings), and the
``algorithm.estimator`` field documents the registry instead of restating it."""

from __future__ import annotations

import ast
import inspect
import pickle
import re
from pathlib import Path

from drmas_train.algorithm import advantages
from drmas_train.algorithm.advantages import DEFAULT_GROUPING, ESTIMATORS, GRPO_FAMILY

ROOT = Path(__file__).resolve().parents[3]


def module_doc_groupings(doc: str) -> dict[str, str | None]:
    """``name -> default grouping`` as the advantages module docstring's bullet list gives them: each ``name``
    followed by ``(grouping)`` or ``(no groups)``."""
    bullets = doc.split("The estimators, with their default grouping", 1)[1].split("\n\n", 2)[1]
    pairs = re.findall(r"``(\w+)``\s+\((?:``(\w+)``|(no groups))\)", bullets)
    return {name: grouping or None for name, grouping, _ in pairs}


def readme_estimators(text: str) -> list[str]:
    """The names of README.md's sentence "Advantage estimators (`algorithm.estimator`): ... and `gae`"."""
    sentence = text.split("Advantage estimators (`algorithm.estimator`):", 1)[1].split("`gae`", 1)[0] + "`gae`"
    return re.findall(r"`(\w+)`", sentence)  # settings such as `critic.per=agent` are not words


def quickstart_estimators(text: str) -> set[str]:
    """The ``estimator:`` values of docs/quickstart.md's preset table (one preset per estimator)."""
    table = text.split("## Compare the estimators", 1)[1].split("\n\n")[2]
    return set(re.findall(r"`estimator: (\w+)`", table))


def field_doc(cls: type, field: str) -> str:
    """The attribute docstring under ``field`` in ``cls``'s source."""
    source = Path(__import__(cls.__module__, fromlist=["_"]).__file__).read_text(encoding="utf-8")
    body = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls.__name__).body
    for stmt, nxt in zip(body, body[1:], strict=False):
        if isinstance(stmt, ast.AnnAssign) and getattr(stmt.target, "id", None) == field:
            return nxt.value.value if isinstance(nxt, ast.Expr) else ""
    raise AssertionError(f"{cls.__name__}.{field} not found")


def test_the_advantages_module_doc_lists_the_registry_with_its_groupings():
    assert module_doc_groupings(advantages.__doc__) == DEFAULT_GROUPING


def test_the_readme_and_the_quickstart_table_list_the_registry():
    assert sorted(readme_estimators((ROOT / "README.md").read_text(encoding="utf-8"))) == sorted(ESTIMATORS)
    assert quickstart_estimators((ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8")) == set(ESTIMATORS)


def test_the_algorithm_section_refers_to_the_registry_instead_of_listing_it():
    from drmas_train.algorithm.config import AlgorithmConfig

    doc = field_doc(AlgorithmConfig, "estimator")
    assert "ESTIMATORS" in doc
    assert [n for n in ESTIMATORS if f"``{n}`` |" in doc or f"| ``{n}``" in doc] == []


def test_the_grpo_family_is_one_function_registered_under_its_groupings():
    fn = advantages.group_normalised
    for name, (grouping, _) in GRPO_FAMILY.items():
        assert ESTIMATORS[name].__wrapped__ is fn and ESTIMATORS[name].__name__ == name
        assert DEFAULT_GROUPING[name] == grouping
        assert inspect.signature(ESTIMATORS[name]).parameters["grouping"].default is None


def test_every_registered_estimator_pickles_by_reference():  # e.g. to a Ray worker
    for name, fn in ESTIMATORS.items():
        assert pickle.loads(pickle.dumps(fn)) is fn, name


def test_a_doc_list_that_disagrees_is_caught():
    doc = "The estimators, with their default grouping:\n\n* ``grpo`` (``prompt``), ``drmas`` (``prompt_call``): x\n\nmore"
    assert module_doc_groupings(doc) == {"grpo": "prompt", "drmas": "prompt_call"}  # a wrong grouping, names missing
    readme = "Advantage estimators (`algorithm.estimator`): `drmas` (`critic.per=agent`), `grpo` and `gae`: more"
    assert readme_estimators(readme) == ["drmas", "grpo", "gae"]
