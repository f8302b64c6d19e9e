"""One module per ``drmas`` subcommand, each exposing ``main(argv) -> int``.

Floor 11 of drmas_train (over floors 0-10; only ``cli``, floor 12, imports it).
"""
from __future__ import annotations

import argparse

__all__ = ["HelpFormatter", "doc_summary"]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every subcommand's ``--help``: each option's default after its help text (flags and options without a
    default excepted), descriptions and epilogs printed as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default == []:
            return action.help  # nothing worth saying: unset, an off flag, or an empty repeatable list
        return super()._get_help_string(action)


def doc_summary(doc: str | None) -> str:
    """A command module's docstring's first paragraph as ``--help`` shows it: without reST's double backquotes
    (````drmas serve````: a terminal prints them as typed)."""
    return (doc or "").split("\n\n")[0].replace("``", "")
