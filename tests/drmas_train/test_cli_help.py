"""Every option of every ``drmas`` subcommand says what it does and, where it has one, its default."""

from __future__ import annotations

import argparse
import importlib

import pytest

from drmas_train.cli import SUBCOMMANDS


def _parsers():
    """(name, parser) of each subcommand and each sub-subcommand (``drmas data list`` ...)."""
    for name, (module, _) in SUBCOMMANDS.items():
        mod = importlib.import_module(module)
        parser = (getattr(mod, "build_parser", None) or mod._parser)()
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                yield from ((f"{name} {sub}", p) for sub, p in action.choices.items())


PARSERS = dict(_parsers())


def test_every_subcommand_is_covered():
    assert set(SUBCOMMANDS) <= set(PARSERS) and "data prepare" in PARSERS


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_every_option_has_help_and_shows_its_default(name):
    parser = PARSERS[name]
    text = parser.format_help()
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        label = action.option_strings[-1] if action.option_strings else action.dest
        assert action.help and action.help.strip(), f"drmas {name} {label} has no help text"
        meaningful = action.default not in (None, False, [], argparse.SUPPRESS) and not action.required
        if meaningful:  # the formatter appends "(default: X)"; the text may be wrapped over lines
            assert f"(default: {action.default})" in " ".join(text.split()), f"drmas {name} {label} hides its default"


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_help_shows_no_rest_markup(name):
    """Before: ``drmas serve --help`` began "``drmas serve``: serve a model ..." (the docstring's reST quotes)."""
    assert "``" not in PARSERS[name].format_help()


def test_serve_help_description_reads_as_plain_text():
    text = PARSERS["serve"].format_help()
    assert "\ndrmas serve: serve a model with the OpenAI API (chat and completions, streaming, concurrent requests " in text
