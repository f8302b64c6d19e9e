"""The training run's tasks and env, built from the config with every user mistake turned into one clear message.

A missing ``env.data`` file, an ``env.id`` typo, or env kwargs that belong to another env (switching ``env.id`` on
top of a preset written for a different env) are user mistakes: each becomes a
:class:`~drmas_train.run.config.ConfigError` naming the config key, what was wrong and what is accepted, raised
before any model loads (``drmas train`` exits 2 on it, without a traceback).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from drmas_train.data.prepare import missing_data_hint
from drmas_train.data.recipe import TASK_FILE_SUFFIXES
from drmas_train.run.config import ConfigError, TrainConfig, presets_for_env

logger = logging.getLogger(__name__)

__all__ = ["SELF_PLAY", "env_generated_tasks", "game_notes", "game_opponents", "game_validation_envs", "held_out_tasks", "is_game",
           "is_procedural", "load_env_tasks", "make_probe_env", "require_task_files", "run_validation_tasks",
           "validation_tasks"]

DATA_FORMS = ("a JSONL/JSON/Parquet file path, 'reasoning_gym:<dataset>' (e.g. reasoning_gym:gsm_symbolic), "
               "'hf:<id>[:<config>][@<split>]', or null for the env's own tasks")  # fmt: skip


def load_env_tasks(cfg: TrainConfig, spec: str | None = None, *, key: str = "env.data", seed: int | None = None,
                   size: int | None = None) -> Any:  # fmt: skip
    """The task source of ``spec`` (default ``cfg.env.data``), or None when it is null.

    ``env.data_options`` apply when ``key`` is ``"env.data"``; their ``size`` (tasks generated, default 1,000) is
    replaced by ``size`` when given (the held-out validation candidates).

    Raises:
        ConfigError: the file does not exist, the spec has no accepted form, or the data set is unknown / broken;
            the message names ``key`` and lists the accepted forms.
    """
    from drmas_envs.data.load import load_tasks

    spec = cfg.env.data if spec is None and key == "env.data" else spec
    if not spec:
        return None
    options = dict(cfg.env.data_options) if key == "env.data" else {}
    if options and not is_procedural(spec):  # e.g. `drmas train env.data=gsm8k.jsonl` on the quickstart preset
        logger.warning("env.data_options %s ignored: they are options of 'reasoning_gym:<name>' data, and %s=%r "
                       "has none", sorted(options), key, spec)  # fmt: skip
        options = {}
    n = options.pop("size", 1000)
    n = n if size is None else size
    try:
        return load_tasks(spec, seed=cfg.seed if seed is None else seed, size=n, options=options)
    except FileNotFoundError as err:
        raise ConfigError(f"{key}={spec!r}: {err}. Accepted: {DATA_FORMS}") from None
    except (ValueError, TypeError, ImportError, OSError) as err:
        raise ConfigError(f"{key}={spec!r}: {err}") from None


def is_procedural(spec: Any) -> bool:
    """Whether ``spec`` names a generated data set (``reasoning_gym:<name>``), whose seeds can repeat problems."""
    return isinstance(spec, str) and spec.startswith(("reasoning_gym:", "reasoning-gym:"))


def held_out_tasks(candidates: Any, train: Any, size: int) -> list[Any]:
    """The first ``size`` tasks of ``candidates`` whose question is not the question of any task in ``train``.

    Validation on a procedural data set draws its tasks from another seed; in a small problem space (one-digit
    sums: a few hundred questions) another seed repeats training problems, so the comparison is by question text.

    Args:
        candidates, train: sequences of :class:`~drmas_envs.core.Task` (``len`` and indexing).
        size: wanted number of tasks (>= 1).

    Returns:
        up to ``size`` tasks, in ``candidates`` order (fewer when ``candidates`` runs out).

    Raises:
        ConfigError: no candidate is held out (the data set's problem space is inside the training tasks).
    """
    seen = {train[i].question for i in range(len(train))}
    out: list[Any] = []
    for i in range(len(candidates)):
        task = candidates[i]
        if task.question not in seen:
            out.append(task)
            if len(out) == size:
                break
    if not out:
        raise ConfigError(
            f"no held-out validation task: all {len(candidates)} candidates repeat a question of the "
            f"{len(train)} training tasks; set eval.data to other problems or widen env.data_options"
        )
    return out


def env_generated_tasks(env: Any, *, seed: int, size: int) -> Any:
    """Held-out validation candidates from an env that generates its own tasks: ``env.generated_tasks(seed, size)``
    (the search envs' synthetic encyclopedia: other questions about the same corpus), or None when the env has no
    such generator or reads its tasks from a file."""
    draw = getattr(getattr(env, "unwrapped", env), "generated_tasks", None)
    return draw(seed, size) if callable(draw) else None


def validation_tasks(
    cfg: TrainConfig, tasks: Any, env: Any = None
) -> tuple[list[Any] | None, list[tuple[int, str]]]:
    """A run's validation tasks (None when ``eval.every`` is 0) and the notes to log about them.

    ``eval.data``: its first ``eval.size`` tasks. Else a procedural ``env.data``, or the env's own tasks when the
    env generates them (:func:`env_generated_tasks`): 1,000 candidates from another seed (``seed + 10000``; the
    training set's size does not apply) minus every training question (:func:`held_out_tasks`). Else a file or
    other env tasks: their first ``eval.size`` rows, which are then not held out (a warning note).

    Args:
        cfg: the run's config.
        tasks: the training tasks (``len`` and indexing), as the env uses them.
        env: an env built from the run's config (its own task generator, if any, is used when ``env.data`` is null).

    Returns:
        ``(tasks or None, [(logging level, message), ...])``.

    Raises:
        ConfigError: a task source that does not load, or no held-out candidate (:func:`held_out_tasks`).
    """
    if cfg.eval.every <= 0:
        return None, []
    notes: list[tuple[int, str]] = []
    if env is not None and is_game(env) and not cfg.eval.data:  # one task (the rules): episodes, not tasks, vary
        val_tasks = [tasks[i] for i in range(len(tasks))]
        notes.append((logging.INFO, f"validation: {cfg.eval.k} episodes of the game (eval.k) against each of "
                                    f"{', '.join(game_opponents(cfg))}, the same seeds at every validation"))  # fmt: skip
        return val_tasks, notes
    spec = cfg.eval.data or cfg.env.data
    key = "eval.data" if cfg.eval.data else "env.data"
    val_src = load_env_tasks(cfg, spec, key=key, seed=cfg.seed + 10_000, size=1000) if spec else tasks
    generated = None if spec or env is None else env_generated_tasks(env, seed=cfg.seed + 10_000, size=1000)
    if generated is not None:  # the env's own generator (the search envs' synthetic encyclopedia), another seed
        val_tasks = held_out_tasks(generated, tasks, cfg.eval.size)
        notes.append((logging.INFO, f"validation: {len(val_tasks)} held-out tasks of the env's own generator "
                                    f"(seed {cfg.seed + 10_000}; questions not in the {len(tasks)} training tasks)"))  # fmt: skip
    elif spec and not cfg.eval.data and is_procedural(spec):  # a small problem space repeats across seeds
        val_tasks = held_out_tasks(val_src, tasks, cfg.eval.size)
        notes.append((logging.INFO, f"validation: {len(val_tasks)} held-out {spec} tasks (questions not in the "
                                    f"{len(tasks)} training tasks)"))  # fmt: skip
    else:
        val_tasks = [val_src[i] for i in range(min(cfg.eval.size, len(val_src)))]
        if not cfg.eval.data:
            source = spec or "the env's own tasks"
            notes.append((logging.WARNING, f"validation reads the training data ({source}): its {len(val_tasks)} "
                                           "tasks are not held out; set eval.data to other problems"))  # fmt: skip
    return val_tasks, notes


#: the name of a game validation without a fixed opponent (every seat played by the trained models)
SELF_PLAY = "self-play"


def is_game(env: Any) -> bool:
    """Whether ``env`` gives each agent its own episode reward (``metadata["per_agent_rewards"]``: the games)."""
    return bool(getattr(env, "metadata", {}).get("per_agent_rewards"))


def game_opponents(cfg: TrainConfig) -> list[str]:
    """The names of a game run's validations: ``eval.opponents``, else the training env's own opponent
    (``env.kwargs.opponent``), else :data:`SELF_PLAY`."""
    if cfg.eval.opponents:
        return list(cfg.eval.opponents)
    return [str(cfg.env.kwargs.get("opponent") or SELF_PLAY)]


def game_validation_envs(cfg: TrainConfig, env_fn: Callable[..., Any], env: Any) -> dict[str, Callable[[], Any]]:
    """A game run's validation envs, one factory per :func:`game_opponents` name; empty for other envs.

    Each is the training env with ``opponent`` set to the name (``None`` for :data:`SELF_PLAY`) and, unless
    ``env.kwargs`` names one, ``opponent_seat="rotate"``: the validation's ``eval.k`` episodes play each seat in
    equal shares (:class:`~drmas_envs.games.openspiel_env.OpenSpielEnv`).

    Args:
        env_fn: ``(**kwargs) -> env``: the training env's factory, ``kwargs`` overriding ``env.kwargs``.
        env: an env built from the run's config (the probe).

    Raises:
        ConfigError: ``eval.opponents`` on an env whose agents share one reward, or an opponent the game does not
            accept (the env's message lists those it does).
    """
    if not is_game(env):
        if cfg.eval.opponents:
            raise ConfigError(f"eval.opponents={list(cfg.eval.opponents)} is for games (an env whose seats get their "
                              f"own returns, docs/games.md); env.id={cfg.env.id!r} gives every agent one reward")  # fmt: skip
        return {}
    out: dict[str, Callable[[], Any]] = {}
    for name in game_opponents(cfg):
        kwargs: dict[str, Any] = {"opponent": None if name == SELF_PLAY else name}
        if kwargs["opponent"] is not None and "opponent_seat" not in cfg.env.kwargs:
            kwargs["opponent_seat"] = "rotate"
        try:
            env_fn(**kwargs)
        except (ValueError, TypeError) as err:
            raise ConfigError(f"eval.opponents: {name!r}: {err}") from None
        out[name] = lambda kw=kwargs: env_fn(**kw)
    return out


def game_notes(cfg: TrainConfig, env: Any) -> list[tuple[int, str]]:
    """Warnings about a game run's advantages (empty for other envs): in self-play (every seat an agent) a
    trajectory unit pooled over the seats (grouping ``prompt`` with trajectory units: ``grpo``, ``rloo``, ...) is
    the mean of every seat's call scores, and all its calls, both seats', get its one advantage: in a zero-sum game
    the seats' returns cancel in that mean when they made as many calls, and otherwise it follows the seat that
    called more (Kuhn poker pass-bet-call: ``(2 R_0 + R_1) / 3 = R_0 / 3``), so one seat is pushed toward the other's
    result. Per-agent grouping (``drmas``) or call units keep each seat's own return.

    Returns:
        ``[(logging level, message), ...]``.
    """
    from drmas_train.algorithm.advantages import effective_grouping
    from drmas_train.algorithm.grouping import cell

    a = cfg.algorithm
    grouping = effective_grouping(a.estimator, a.grouping)
    if not is_game(env) or cfg.env.kwargs.get("opponent") or grouping is None:
        return []
    per_agent, units = cell(grouping, a.units)
    if per_agent or units != "trajectory":
        return []
    return [(logging.WARNING, f"self-play with algorithm.estimator={a.estimator!r} (grouping {grouping!r}, trajectory "
                              "units): all calls of a hand, both seats', get one advantage from the mean of the "
                              "seats' returns, which cancel in a zero-sum game or push one seat toward the other's "
                              "result; use algorithm.estimator=drmas (per-agent grouping), algorithm.units=call, or "
                              "a fixed opponent (env.kwargs.opponent)")]  # fmt: skip


def run_validation_tasks(cfg: TrainConfig) -> list[Any] | None:
    """The validation tasks a training run with config ``cfg`` used (:func:`validation_tasks` of its training
    tasks: ``env.data``, or the env's own tasks), rebuilt from the config alone; None when it validated nothing.

    Raises:
        ConfigError: as :func:`validation_tasks`, or an ``env.data`` that does not load.
    """
    if cfg.eval.every <= 0:
        return None
    tasks, env = load_env_tasks(cfg), None
    if tasks is None:  # the env's own tasks, as build_run reads them
        import drmas_envs

        env = make_probe_env(cfg, lambda: drmas_envs.make(cfg.env.id, **dict(cfg.env.kwargs)))
        tasks = env.tasks
    return validation_tasks(cfg, tasks, env)[0]


def _accepted_kwargs(env_id: str) -> set[str] | None:
    import drmas_envs

    try:
        params = inspect.signature(drmas_envs.spec(env_id).load()).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return set(params)


def _preset_hint(env_id: str) -> str:
    presets = presets_for_env(env_id)
    if not presets:
        return f" Set env.kwargs for {env_id!r} yourself (drmas envs lists every env's arguments)."
    return f" Start from a preset written for {env_id!r}: --config {presets[0]} (all: {', '.join(presets)})."


def make_probe_env(cfg: TrainConfig, env_fn: Callable[[], Any]) -> Any:
    """Build one env with ``env_fn`` (``drmas_envs.make(cfg.env.id, data=..., **cfg.env.kwargs)``).

    Raises:
        ConfigError: ``env.id`` is not registered (with the closest ids); ``env.data`` or ``env.kwargs`` keys
            that the env does not take (naming them, the env's accepted arguments and its presets); or the env's
            own rejection of a value.
    """
    import drmas_envs
    from drmas_envs.registration import RegistrationError, UnknownKwargError

    env_id = cfg.env.id
    try:
        drmas_envs.spec(env_id)
    except RegistrationError as err:
        raise ConfigError(f"env.id={env_id!r}: {err}") from None
    accepted = _accepted_kwargs(env_id)
    if accepted is not None:
        given = list(cfg.env.kwargs) + (["data"] if cfg.env.data else [])
        foreign = [k for k in given if k not in accepted]
        if foreign:
            keys = ", ".join("env.data" if k == "data" else f"env.kwargs.{k}" for k in foreign)
            takes = ", ".join(sorted(accepted - {"render_mode"}))
            data_note = " (it takes no env.data: set env.data=null)" if "data" in foreign else ""
            raise ConfigError(
                f"env.id={env_id!r} does not take {keys} (left from a config written for another env?); "
                f"it takes: {takes}{data_note}.{_preset_hint(env_id)}"
            )
    try:
        return env_fn()
    except UnknownKwargError as err:
        raise ConfigError(f"env.kwargs: {err}.{_preset_hint(env_id)}") from None
    except (ValueError, TypeError, FileNotFoundError) as err:
        raise ConfigError(f"env {env_id!r} rejected its config (env.data / env.kwargs): {err}") from None


def require_task_files(cfg: Any) -> None:
    """Check that the task files a :class:`~drmas_train.run.config.TrainConfig` names exist (``env.data``,
    ``env.kwargs.tasks``, and ``eval.data`` when evaluating), before anything loads.

    Raises:
        drmas_train.run.config.ConfigError: naming the key, the path and, for a recipe's output, the
            ``drmas data prepare`` command that writes it.
    """
    keys = (("env.data", cfg.env.data), ("env.kwargs.tasks", cfg.env.kwargs.get("tasks")),
            ("eval.data", cfg.eval.data if cfg.eval.every > 0 else None))  # fmt: skip
    for key, spec in keys:
        if isinstance(spec, str) and spec.endswith(TASK_FILE_SUFFIXES) and not Path(spec).is_file():
            hint = missing_data_hint(spec)  # a recipe's output: the command that writes it; else the accepted forms
            raise ConfigError(f"{key}={spec!r}: task file {spec!r} not found" + (hint or f". Accepted: {DATA_FORMS}"))
