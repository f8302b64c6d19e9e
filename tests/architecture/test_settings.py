"""The update's typed settings: built once from the config, carried whole, and every default in one place.

The config sections hold the defaults of every setting (drmas_train/algorithm/config.py, collect/config.py, ...).
No other stage restates one: a function parameter or record field named after an update, optimizer or estimator
setting has no default, ``None`` ("the config's default") or a named constant that the config section names too,
never a literal of its own, so two places can never disagree (as ``micro_batch_tokens`` once did: 2048 in the
config, 8192 in ``ppo_update``).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

import drmas_train
from drmas_train.algorithm.config import AlgorithmConfig, OptimConfig
from drmas_train.algorithm.losses import LOSS_FIELDS, PolicyLossConfig
from drmas_train.algorithm.settings import UpdateSettings
from drmas_train.errors import ConfigError
from drmas_train.run.config import load_config

PACKAGE = Path(drmas_train.__file__).resolve().parent
#: settings that cross stage boundaries (config -> algorithm -> distributed ranks): their default lives in the
#: config section only.
CROSSING = {f.name for f in dataclasses.fields(UpdateSettings) if f.default is dataclasses.MISSING} - {"loss"}
CROSSING |= set(LOSS_FIELDS) | {f.name for f in dataclasses.fields(OptimConfig)}
CROSSING -= {"temperature"}  # a sampling parameter of many functions (generation, log-probs), not only the update's
CROSSING |= {"norm_by_std", "eps", "singleton"}  # the estimators' normalisation settings (group_stats' own
# ``unbiased`` is a statistics helper's convention, not the ``algorithm.unbiased_std`` setting it is given)
OWNERS = {"AlgorithmConfig", "OptimConfig", "CriticConfig"}  # the sections whose fields these are (the critic's
# optimizer settings share the optim section's names: critic.lr is the critic's own setting, with its own default)


def test_settings_are_the_config_sections_values():
    cfg = load_config("quickstart_math", ["optim.micro_batch_tokens=1234", "algorithm.clip_high=0.28",
                                          "algorithm.mini_batches=3", "optim.autocast=auto", "rollout.temperature=0.7"])  # fmt: skip
    s = UpdateSettings.from_config(cfg.algorithm, cfg.optim, temperature=cfg.rollout.temperature)
    assert (s.micro_batch_tokens, s.loss.clip_high, s.mini_batches, s.autocast, s.temperature) == (1234, 0.28, 3, "auto", 0.7)
    for name in LOSS_FIELDS:  # the loss settings carry the algorithm section's fields under their own names
        assert getattr(s.loss, name) == getattr(cfg.algorithm, name), name
    for f in dataclasses.fields(UpdateSettings):
        if f.default is dataclasses.MISSING and f.name not in ("loss", "temperature"):
            section = cfg.algorithm if hasattr(cfg.algorithm, f.name) else cfg.optim
            assert getattr(s, f.name) == getattr(section, f.name), f.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.micro_batch_tokens = 1  # type: ignore[misc]


def test_defaults_are_the_config_defaults():
    s = UpdateSettings.defaults()
    assert s == UpdateSettings.from_config(AlgorithmConfig(), OptimConfig(), temperature=1.0)
    assert s.micro_batch_tokens == OptimConfig().micro_batch_tokens == 2048
    assert s.replace(loss_agg="seq-mean-token-sum").loss.loss_agg == "seq-mean-token-sum"  # loss fields by name
    with pytest.raises(TypeError):
        s.replace(no_such_setting=1)


@pytest.mark.parametrize(("changes", "message"), [
    ({"micro_batch_tokens": "big"}, r"optim.micro_batch_tokens must be an int >= 1 or 'auto', got 'big'"),
    ({"activation_checkpointing": -1}, r"optim.activation_checkpointing must be >= 0, got -1"),
    ({"mini_batches": 0}, r"algorithm.mini_batches must be >= 1, got 0"),
    ({"autocast": "fp8"}, r"optim.autocast='fp8'; accepted: off, bf16, auto"),
])  # fmt: skip
def test_settings_built_by_hand_get_the_config_sections_checks(changes, message):
    with pytest.raises(ConfigError, match=message):
        UpdateSettings.defaults(**changes)


def test_settings_are_checked_once_where_they_are_built(monkeypatch):
    """The sections' own checks run once per build, on the sections given (no copy of them is rebuilt), and a
    copy made by ``replace`` is not checked again."""
    checks = []
    for section in (AlgorithmConfig, OptimConfig):
        original = section.validate
        monkeypatch.setattr(section, "validate", lambda self, original=original: checks.append(self) or original(self))
    algorithm, optim = AlgorithmConfig(mini_batches=2), OptimConfig(micro_batch_tokens=64)
    s = UpdateSettings.from_config(algorithm, optim, temperature=1.0)
    assert checks == [algorithm, optim] and checks[0] is algorithm and checks[1] is optim
    assert s.replace(micro_batch_tokens=32, share_prompts=False).micro_batch_tokens == 32 and len(checks) == 2
    d = UpdateSettings.defaults(mini_batches=3, micro_batch_tokens=16, lm_head_chunk=0, temperature=0.5)
    assert len(checks) == 4 and (checks[2].mini_batches, checks[3].micro_batch_tokens) == (3, 16)
    assert (d.mini_batches, d.micro_batch_tokens, d.lm_head_chunk, d.temperature) == (3, 16, 0, 0.5)
    with pytest.raises(ConfigError, match=re.escape("algorithm.ppo_epochs must be >= 1, got 0")):
        UpdateSettings.from_config(AlgorithmConfig(ppo_epochs=0), OptimConfig(), temperature=1.0)


def test_the_loss_settings_have_no_defaults_of_their_own():
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(PolicyLossConfig))
    assert set(LOSS_FIELDS) <= {f.name for f in dataclasses.fields(AlgorithmConfig)}


def _restated_defaults(package: Path) -> list[str]:
    """Every parameter or dataclass field named after a crossing setting whose default is a literal value (not
    ``None``, not a named constant), outside the config sections that own them. A named constant is written once
    (e.g. ``drmas_train.algorithm.advantages.EPS``, which the config section names too)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                pairs = list(zip(a.args[len(a.args) - len(a.defaults):], a.defaults, strict=True))
                pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
                where = f"{path.relative_to(package.parent)}:{node.lineno} {node.name}()"
            elif isinstance(node, ast.ClassDef) and node.name not in OWNERS:
                pairs = [(s.target, s.value) for s in node.body
                         if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.value is not None]  # fmt: skip
                where = f"{path.relative_to(package.parent)}:{node.lineno} class {node.name}"
            else:
                continue
            for target, default in pairs:
                name = getattr(target, "arg", None) or getattr(target, "id", None)
                if name in CROSSING and isinstance(default, (ast.Constant, ast.Tuple, ast.List, ast.UnaryOp)) and not (
                    isinstance(default, ast.Constant) and default.value is None
                ):
                    found.append(f"{where}: {name} = {ast.unparse(default)}")
    return found


def test_no_stage_restates_a_default():
    restated = _restated_defaults(PACKAGE)
    assert not restated, "defaults restated outside their config section:\n" + "\n".join(restated)


def test_a_restated_default_is_caught(tmp_path):
    pkg = tmp_path / "drmas_train"
    (pkg / "algorithm").mkdir(parents=True)
    (pkg / "algorithm" / "update.py").write_text("def ppo_update(model, *, micro_batch_tokens=8192, lr=None):\n    pass\n")
    assert _restated_defaults(pkg) == ["drmas_train/algorithm/update.py:1 ppo_update(): micro_batch_tokens = 8192"]
