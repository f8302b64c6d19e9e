"""drmas_envs.core.projection: the reference's general_projection (langfengQ/DrMAS agent_system/agent/utils.py:155-211)."""

import pytest

from drmas_envs.core.projection import Projection, has_cjk, has_single_think, project_action


@pytest.mark.parametrize(
    ("text", "kwargs", "expected"),
    [
        ("<search> q </search>", {}, Projection("<search>q</search>", "q", True)),
        ("<search> q </search>", {"keep_tag": False}, Projection("q", "q", True)),
        ("no tags", {}, Projection("", None, False)),
        ("no tags", {"keep_whole": True}, Projection("no tags", None, False)),
        ("<search>a</search><search>b</search>", {}, Projection("<search>a</search>", "a", True)),  # first pair
        ("</search>x<search>", {}, Projection("<search></search>", "", True)),  # closing first: empty slice
        ("<Search>q</Search>", {}, Projection("", None, False)),  # exact tags only
        ("ok <verify> yes </verify>!", {"keep_whole": True}, Projection("ok <verify>yes</verify>!", "yes", True)),
        ("<search>北京</search>", {}, Projection("<search>北京</search>", "北京", False)),  # CJK: invalid
        ("<search>北京</search>", {"reject_cjk": False}, Projection("<search>北京</search>", "北京", True)),
        ("<search>q</search>", {"check_think": True}, Projection("<search>q</search>", "q", False)),
        ("<think>t</think><search>q</search>", {"check_think": True}, Projection("<search>q</search>", "q", True)),
    ],
)
def test_project_action(text, kwargs, expected):
    assert project_action(text, "verify" if "verify" in text else "search", **kwargs) == expected


@pytest.mark.parametrize(
    ("text", "ok"),
    [("<think>a</think>", True), ("x<think>a</think>y", True), ("<think>a", False), ("</think><think>", False),
     ("<think>a</think><think>b</think>", False), ("<think><think>a</think>", False), ("", False)],
)
def test_has_single_think(text, ok):
    assert has_single_think(text) is ok


def test_has_cjk_and_type_errors():
    assert has_cjk("答案") and not has_cjk("Ångström café")
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        project_action(b"<search>q</search>", "search")
