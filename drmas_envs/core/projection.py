"""The Dr. MAS reference's *action projection*: how one agent's reply becomes (action text, is_action_valid).

This is ``general_projection`` of the reference (``langfengQ/DrMAS agent_system/agent/utils.py:155-211``),
one reply at a time, with the same rules:

* Tags are matched **exactly** (case-sensitive, no inner padding): the *first* ``<tag>`` and the *first*
  ``</tag>`` in the reply (``str.find``). If either is missing the reply is invalid and, unless the whole reply is
  kept, its action is ``""``.
* The content between them is stripped of surrounding whitespace. Kept as the whole reply
  (``keep_whole=True``: the reply with that content stripped in place, the search Verifier's and the math
  Verifier's rule), as ``<tag>content</tag>`` (the search and answer agents' rule), or as the bare content.
* A reply containing any CJK ideograph (U+4E00..U+9FFF) is invalid (``utils.py:194-196``), whatever its tags.
* With ``check_think=True`` the reply must hold exactly one ``<think>`` and one ``</think>``, the opening first
  (``utils.py:198-208``); otherwise it is invalid, but its action is still extracted (validity only sets the
  format penalty, it never blocks the action: ``search_agent.py:55``).

Pure functions of text: no env state, bounded by the caller's cut of the reply (``max_action_chars``).
"""

from __future__ import annotations

import dataclasses
import re

__all__ = ["Projection", "project_action", "has_single_think", "has_cjk"]

_CJK = re.compile(r"[\u4e00-\u9fff]")


@dataclasses.dataclass(frozen=True)
class Projection:
    """One projected reply.

    Attributes:
        action: what the env acts on (see :func:`project_action` for the three forms).
        content: the stripped text between the tags, or ``None`` when the tag pair was not found.
        valid: the reference's ``is_action_valid`` (tags found, no CJK, and the ``<think>`` rule when checked).
    """

    action: str
    content: str | None
    valid: bool


def has_cjk(text: str) -> bool:
    """Whether ``text`` holds a CJK ideograph (the reference marks such replies invalid, ``utils.py:194-196``)."""
    return _CJK.search(text) is not None


def has_single_think(text: str) -> bool:
    """Exactly one ``<think>`` and one ``</think>``, the opening before the closing (``utils.py:198-208``).

    >>> has_single_think("<think>a</think><search>q</search>"), has_single_think("<think>a<think>b</think>")
    (True, False)
    """
    opening, closing = text.find("<think>"), text.find("</think>")
    return (text.count("<think>") == 1 and text.count("</think>") == 1
            and opening != -1 and closing != -1 and closing > opening)


def project_action(
    text: str,
    tag: str,
    *,
    keep_whole: bool = False,
    keep_tag: bool = True,
    check_think: bool = False,
    reject_cjk: bool = True,
) -> Projection:
    """Project one reply onto ``<tag>...</tag>`` as the reference's ``general_projection`` does.

    Args:
        text: the agent's reply (untrusted; the caller bounds its length).
        tag: the tag name, e.g. ``"search"`` (matched exactly: ``<search>`` and ``</search>``).
        keep_whole: the action is the whole reply with the tag content stripped in place
            (``return_whole_response=True``); a reply without the tags is kept unchanged (and invalid).
        keep_tag: otherwise, the action is ``<tag>content</tag>`` (``return_tag=True``) or the bare content;
            ``""`` when the tags are missing.
        check_think: also require the single ``<think>...</think>`` block (:func:`has_single_think`).
        reject_cjk: mark replies with CJK ideographs invalid (the reference always does; ``False`` skips it).

    Returns:
        The :class:`Projection`.

    Raises:
        TypeError: ``text`` is not a str.

    >>> project_action("<think>x</think> <search>  capital of France </search>", "search", check_think=True)
    Projection(action='<search>capital of France</search>', content='capital of France', valid=True)
    >>> project_action("<answer>Paris</answer>", "answer", check_think=True)
    Projection(action='<answer>Paris</answer>', content='Paris', valid=False)
    >>> project_action("Enough. <verify> yes </verify>", "verify", keep_whole=True).action
    'Enough. <verify>yes</verify>'
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    start_tag, end_tag = f"<{tag}>", f"</{tag}>"
    start, end = text.find(start_tag), text.find(end_tag)
    if start == -1 or end == -1:
        action, content, valid = (text if keep_whole else ""), None, False
    else:
        # a closing tag before the opening one gives an empty slice, as in the reference
        content = text[start + len(start_tag) : end].strip()
        valid = True
        if keep_whole:
            action = text[: start + len(start_tag)] + content + text[end:]
        else:
            action = f"{start_tag}{content}{end_tag}" if keep_tag else content
    if reject_cjk and has_cjk(text):
        valid = False
    if check_think and not has_single_think(text):
        valid = False
    return Projection(action, content, valid)
