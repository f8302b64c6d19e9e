"""The trainer is one loop over two typed protocols (docs/architecture.md, "The training loop"): the loop reads on one
screen and names no mode; every producer and updater implements its whole protocol."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from drmas_train.run import producers, trainer, updater
from drmas_train.run.updater import LocalUpdater, PacedUpdater, Updater

#: config switches whose differences live in producers and updater capabilities, never in the loop
MODE_SWITCHES = ("cfg.run.mode", "cfg.run.overlap", "cfg.run.pacing", "cfg.run.max_staleness", "cfg.distributed")


def _members(protocol: type) -> set[str]:
    """The names a protocol declares (methods, properties, annotated attributes), its bases' included."""
    names: set[str] = set()
    for cls in protocol.__mro__:
        if cls is object or cls.__name__ in ("Protocol", "Generic"):
            continue
        names |= {n for n in vars(cls) if not n.startswith("_") or n in ("__enter__", "__exit__")}
        names |= set(getattr(cls, "__annotations__", {}))
    return names


def test_the_loop_fits_on_one_screen_and_names_no_mode():
    source = textwrap.dedent(inspect.getsource(trainer._loop))
    assert len(source.splitlines()) <= 60
    read = {ast.unparse(n) for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Attribute)}
    assert "cfg.run.iterations" in read  # the walk sees the config the loop reads
    assert not {name for name in read if name.startswith(MODE_SWITCHES)}


@pytest.mark.parametrize("cls", [producers.InlineProducer, producers.BufferedProducer])
def test_every_producer_implements_the_producer_protocol(cls):
    missing = {n for n in _members(producers.Producer) if not hasattr(cls, n) and n not in cls.__annotations__}
    assert not missing, f"{cls.__name__} lacks {sorted(missing)}"


def test_every_updater_implements_its_protocol():
    pytest.importorskip("ray")
    from drmas_train.distributed.updater import RayUpdater

    declared = _members(Updater) - {"critic_keys"}  # an instance attribute of both
    assert declared == {"model_ids", "world_size", "start_iteration", "critic_values", "kl_logprobs", "update_critics",
                        "update", "resume_generation", "write_state", "read_state", "recover", "close"}  # fmt: skip
    assert {n for n in declared if not hasattr(LocalUpdater, n)} == set()
    assert {n for n in _members(PacedUpdater) - {"critic_keys"} if not hasattr(RayUpdater, n)} == set()
    assert not hasattr(LocalUpdater, "start_model")  # per-model pacing is the Ray updater's capability alone
    assert updater.build_updater.__annotations__["return"] == "Updater"
