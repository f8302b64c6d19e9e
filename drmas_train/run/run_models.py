"""Which model played each role of a training run, at each of its checkpoints: the model specs that
``drmas eval --team`` and ``drmas crossplay`` play.

A run directory holds ``config.yaml`` (the resolved :class:`~drmas_train.run.config.TrainConfig`: ``agents`` says
which model key, or ``<key>:<adapter>``, each role uses) and ``checkpoints/iter_<N>/models/<key>/`` (the key's
weights at iteration N, written by :mod:`drmas_train.run.checkpoint`; a LoRA key holds only its adapter, the
adapters of ``models.<key>.adapters`` one folder each: ``models/<key>/<adapter>/``). A role's model at

* iteration 0 is the config's model as the run started (``name_or_path`` with the run's seed; a LoRA adapter starts
  at B = 0, so its base alone is that policy);
* iteration N is ``models/<key>[/<adapter>]`` of checkpoint N: a Hugging Face folder, or a PEFT adapter folder,
  played on the config's base model (:attr:`~drmas_train.model.models.ModelSpec.adapter_path`; adapters of one
  base named apart so that the base is loaded once, :mod:`drmas_train.model.adapters`).

Every spec gets a ``model_id`` that names where it came from, ``<run>/iter_<N>/<key>`` or ``<run>/base/<key>``:
result rows record it per role (``agent_models``), so a leaderboard entry says which checkpoint played each role.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from drmas_train.model.adapters import split_model_id
from drmas_train.run.checkpoint import checkpoint_iteration, latest_checkpoint

__all__ = ["RunModelsError", "RunView", "open_run", "role_model", "team_model", "same_family", "run_config_path"]


class RunModelsError(ValueError):
    """A run, checkpoint or role that cannot give a model (the message says what was wrong and what is accepted)."""


@dataclasses.dataclass(frozen=True)
class RunView:
    """A training run's config and complete checkpoints.

    Attributes:
        run_dir: the run directory. cfg: its :class:`~drmas_train.run.config.TrainConfig`. name: ``run.name`` (or
        the directory's name). checkpoints: ``iteration -> checkpoint directory``.
    """

    run_dir: Path
    cfg: Any
    name: str
    checkpoints: dict[int, Path]

    @property
    def roles(self) -> list[str]:
        """The run's agents, in its config's order."""
        return list(self.cfg.agents)

    def model_name(self, role: str) -> str:
        """``agents.<role>``: the model key (or ``<key>:<adapter>``) of ``role``.

        Raises:
            RunModelsError: ``role`` is not an agent of the run.
        """
        if role not in self.cfg.agents:
            raise RunModelsError(
                f"role {role!r} is not an agent of run {self.run_dir}; its agents: {self.roles}"
            )
        return self.cfg.agents[role]


def _read_config(path: Path) -> Any:
    from drmas_train.run.config import ConfigError, from_yaml

    try:
        return from_yaml(path.read_text())
    except (ConfigError, ValueError) as err:
        raise RunModelsError(f"{path} is not a valid drmas training config: {err}") from None


def open_run(path: str | Path) -> RunView:
    """The run at ``path`` (a run directory: ``config.yaml`` and ``checkpoints/``).

    Raises:
        RunModelsError: ``path`` is not a directory or holds no ``config.yaml``.
    """
    run_dir = Path(path)
    if not (run_dir / "config.yaml").is_file():
        raise RunModelsError(f"{run_dir} is not a drmas run directory (no config.yaml); give the run.dir of a "
                             "'drmas train' run")  # fmt: skip
    cfg = _read_config(run_dir / "config.yaml")
    root = run_dir / "checkpoints"
    found = {}
    if root.is_dir():
        for p in root.iterdir():
            try:
                it = checkpoint_iteration(p)
            except ValueError:
                continue
            if (p / "trainer_state.pt").is_file():
                found[it] = p
    return RunView(run_dir, cfg, cfg.run.name or run_dir.name, dict(sorted(found.items())))


def _base_fields(cfg: Any, key: str) -> dict[str, Any]:
    m = cfg.models[key]
    return {"name_or_path": m.name_or_path, "dtype": m.dtype, "device": m.device, "seed": cfg.seed,
            "chat_template_kwargs": dict(m.chat_template_kwargs)}  # fmt: skip


def _adapter_name(key: str, adapter: str | None, label: str) -> str:
    """A PEFT adapter name unique to (model, checkpoint), so that adapters of one base share it in one pool."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{adapter or key}_{label}")


def _folder_spec(
    cfg: Any, key: str, adapter: str | None, folder: Path, model_id: str, label: str
) -> dict[str, Any]:
    """The spec of a checkpoint's model folder: the folder itself, or a PEFT adapter folder on the config's base."""
    if (folder / "adapter_config.json").is_file():
        return {**_base_fields(cfg, key), "adapter_path": str(folder), "adapter": _adapter_name(key, adapter, label),
                "trainable": False, "model_id": model_id}  # fmt: skip
    m = cfg.models[key]
    return {"name_or_path": str(folder), "dtype": m.dtype, "device": m.device,
            "chat_template_kwargs": dict(m.chat_template_kwargs), "model_id": model_id}  # fmt: skip


def role_model(run: RunView, role: str, iteration: int, *, played_by: str | None = None) -> dict[str, Any]:
    """The spec (a dict of :class:`~drmas_train.model.models.ModelSpec` fields) of the model that plays ``role`` at
    ``iteration`` of ``run``: its own, or with ``played_by`` the model of that other role (a role swap).

    Raises:
        RunModelsError: an unknown role, or no checkpoint of ``iteration`` (the message lists the iterations kept
            and how to keep more: ``run.keep_checkpoints``, ``run.save_every``).
    """
    run.model_name(role)
    name = run.model_name(played_by or role)
    key, adapter = split_model_id(name)
    if iteration == 0:
        return {**_base_fields(run.cfg, key), "model_id": f"{run.name}/base/{name}"}
    ckpt = run.checkpoints.get(iteration)
    if ckpt is None:
        kept = sorted(run.checkpoints)
        raise RunModelsError(
            f"run {run.run_dir} has no checkpoint of iteration {iteration} (it keeps {kept or 'none'}, and 0 is the "
            f"initial model); cross-play over iterations needs each one kept: train with run.save_every and a "
            f"run.keep_checkpoints large enough (this run: save_every={run.cfg.run.save_every}, keep_checkpoints="
            f"{run.cfg.run.keep_checkpoints})"
        )
    folder = ckpt / "models" / key / adapter if adapter else ckpt / "models" / key
    if not folder.is_dir():
        raise RunModelsError(
            f"checkpoint {ckpt} has no model folder {folder.relative_to(ckpt)} for role {role!r}"
        )
    return _folder_spec(
        run.cfg, key, adapter, folder, f"{run.name}/iter_{iteration}/{name}", f"it{iteration}"
    )


def team_model(source: str, role: str) -> str | dict[str, Any]:
    """What ``drmas eval --team ROLE=SOURCE`` plays as ``role``.

    ``source`` is, in this order: a run directory (the role's model at the run's latest checkpoint); a checkpoint
    directory ``.../checkpoints/iter_<N>`` (the role's model in it); a model folder inside a checkpoint,
    ``.../iter_<N>/models/<key>[/<adapter>]`` (that model, whichever role it played: a role swap; a LoRA adapter is
    played on its run's base); anything else is a model name or path for
    :func:`~drmas_train.model.models.load_model`, returned as it is.

    Raises:
        RunModelsError: a run without checkpoints, a role the run does not have, a broken checkpoint, a checkpoint
            directory of a run that does not keep it (the message lists the kept iterations).
    """
    path = Path(source)
    if (path / "config.yaml").is_file() and (path / "trainer_state.pt").is_file():  # a checkpoint directory
        run = RunView(path.parent.parent, _read_config(path / "config.yaml"), "", {})
        run = dataclasses.replace(run, name=run.cfg.run.name or run.run_dir.name,
                                  checkpoints={checkpoint_iteration(path): path})  # fmt: skip
        return role_model(run, role, checkpoint_iteration(path))
    if (path / "config.yaml").is_file():  # a run directory
        run = open_run(path)
        latest = latest_checkpoint(path / "checkpoints")
        if latest is None or not run.checkpoints:
            raise RunModelsError(
                f"run {path} has no checkpoint yet; give a model, or train until one is saved"
            )
        return role_model(run, role, max(run.checkpoints))
    if not path.exists() and path.parent.name == "checkpoints" and (path.parent.parent / "config.yaml").is_file():
        run = open_run(path.parent.parent)  # a checkpoint of a run that is not (or no longer) kept
        raise RunModelsError(
            f"checkpoint {path} does not exist: run {run.run_dir} keeps {sorted(run.checkpoints) or 'none'} "
            f"(run.save_every={run.cfg.run.save_every}, run.keep_checkpoints={run.cfg.run.keep_checkpoints}); give a "
            f"kept one, or the run directory for its latest"
        )
    for parent in path.parents:  # a model folder inside a checkpoint: .../iter_N/models/<key>[/<adapter>]
        if parent.name == "models" and (parent.parent / "config.yaml").is_file():
            ckpt = parent.parent
            cfg = _read_config(ckpt / "config.yaml")
            parts = path.relative_to(parent).parts
            key, adapter = parts[0], (parts[1] if len(parts) > 1 else None)
            if key not in cfg.models:
                raise RunModelsError(
                    f"{path}: model key {key!r} is not in {ckpt / 'config.yaml'} ({sorted(cfg.models)})"
                )
            try:
                it = checkpoint_iteration(ckpt)
            except ValueError:
                it = 0
            name = f"{key}:{adapter}" if adapter else key
            model_id = f"{cfg.run.name or ckpt.parent.parent.name}/iter_{it}/{name}"
            return _folder_spec(cfg, key, adapter, path, model_id, f"it{it}")
    return source


def same_family(run: RunView, role: str, other: str) -> bool:
    """Whether ``other``'s model can stand in for ``role``'s in a role swap: the same base model (``name_or_path``)
    and dtype, so the same architecture and tokenizer."""
    a = run.cfg.models[split_model_id(run.model_name(role))[0]]
    b = run.cfg.models[split_model_id(run.model_name(other))[0]]
    return (a.name_or_path, a.dtype) == (b.name_or_path, b.dtype)


def run_config_path(source: str | Path) -> Path | None:
    """The ``config.yaml`` of the training run ``source`` comes from: a run directory, a checkpoint directory
    ``.../checkpoints/iter_<N>`` or a model folder inside a checkpoint ``.../iter_<N>/models/<key>[/<adapter>]``
    (each checkpoint holds the run's config, :mod:`drmas_train.run.checkpoint`); None for anything else (a model
    name, an exported folder, a checkpoint saved without a config: an empty ``config.yaml``)."""

    def written(config: Path) -> bool:
        return config.is_file() and config.stat().st_size > 0

    path = Path(source)
    if written(path / "config.yaml"):
        return path / "config.yaml"
    for parent in path.parents:
        if parent.name == "models" and written(parent.parent / "config.yaml"):
            return parent.parent / "config.yaml"
    return None
