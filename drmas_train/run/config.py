"""The training configuration: the sections of every stage composed into one :class:`TrainConfig`, YAML presets,
dotted overrides, and the checks that span sections.

Each stage owns its section and its defaults (one default per setting, in one place): ``models`` ->
:class:`drmas_train.model.config.ModelConfig`, ``rollout`` -> :class:`drmas_train.collect.config.RolloutConfig`,
``algorithm`` / ``optim`` / ``critic`` -> :mod:`drmas_train.algorithm.config`, ``eval`` ->
:class:`drmas_train.eval.config.ValidationConfig`, ``distributed`` -> :class:`drmas_train.distributed.config.DistributedConfig`;
``env`` and ``run`` live here. They are re-exported from this module. A preset in ``drmas_train/configs/``
overrides only what differs; a preset may start with ``extends: <other preset>`` (only the estimator differs
between a ``drmas_*`` preset and its ``grpo_*`` twin); a child's ``models``/``agents`` replace the parent's whole. Command-line overrides are OmegaConf dotted keys::

    cfg = load_config("quickstart_math", ["rollout.group_size=4", "algorithm.estimator=grpo"])

Every error (unknown key, wrong type, unknown estimator, agent without model, ...) is a :class:`ConfigError`
raised by :func:`load_config` before anything heavy (models, envs) is built.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from drmas_train.algorithm.advantages import (
    BATCH_WHITENED,
    effective_grouping,
    needs_critic,
    needs_greedy_baseline,
)
from drmas_train.algorithm.config import AlgorithmConfig, CriticConfig, OptimConfig
from drmas_train.algorithm.grouping import GROUPINGS, POOLED_GROUPINGS
from drmas_train.backends.base import LOCAL_BACKENDS
from drmas_train.collect.config import RolloutConfig
from drmas_train.distributed.config import DistributedConfig
from drmas_train.errors import ConfigError, require
from drmas_train.eval.config import ValidationConfig
from drmas_train.model.adapters import split_model_id
from drmas_train.model.assignment import agent_mismatch
from drmas_train.model.config import LoraConfig, ModelConfig

#: ``run.mode``: the synchronous loop (default) or the asynchronous one (docs/async.md).
RUN_MODES = ("sync", "async")
#: ``run.pacing``: every model updated at every step of the asynchronous loop, or each model at its own pace.
PACINGS = ("lockstep", "per_model")

__all__ = [
    "ConfigError",  # drmas_train.errors.ConfigError, re-exported
    "LoraConfig",
    "ModelConfig",
    "EnvConfig",
    "RolloutConfig",
    "AlgorithmConfig",
    "OptimConfig",
    "CriticConfig",
    "ValidationConfig",
    "RunConfig",
    "DistributedConfig",
    "TrainConfig",
    "DEFAULT_PRESET",
    "list_presets",
    "presets_for_env",
    "preset_path",
    "load_config",
    "validate_config",
    "to_yaml",
]

#: preset used by ``drmas train`` when no ``--config`` is given.
DEFAULT_PRESET = "quickstart_math"


@dataclass
class EnvConfig:
    """The environment: ``drmas_envs.make(id, data=data, **kwargs)``."""

    id: str = "math-solver-verifier-v0"
    """registered env id."""
    data: str | None = "reasoning_gym:gsm_symbolic"
    """training tasks, passed to the env as ``data=``: a JSONL/Parquet path, ``reasoning_gym:<name>`` or
    ``hf:<id>`` (:func:`drmas_envs.data.load.load_tasks`); null = the env's own default tasks."""
    data_options: dict[str, Any] = field(default_factory=dict)
    """options of a ``reasoning_gym:<name>`` data set (``reasoning_gym.create_dataset`` keywords, e.g.
    ``{max_digits: 2}``; ``size``: how many training tasks, default 1,000); also used for the held-out validation
    tasks when ``eval.data`` is null. Files and HF ids have no options: they are then ignored, with a warning."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """extra env arguments (e.g. ``max_loops``, ``format_penalty``)."""


@dataclass
class RunConfig:
    """Iterations, outputs and bookkeeping."""

    name: str | None = None
    """the run's name in plot titles and logs; null = the preset name or YAML file stem it was loaded from."""
    iterations: int = 10
    """training iterations (one rollout + update each)."""
    dir: str = "runs/drmas"
    """run directory: metrics.jsonl, tensorboard/, checkpoints/, plots."""
    save_every: int = 0
    """checkpoint every this many iterations (0 = only at the end)."""
    keep_checkpoints: int = 2
    """how many most recent checkpoints to keep; a save needs disk room for one more beside them (the new one is
    written before older ones are deleted, so ``1`` needs room for two)."""
    num_threads: int = 0
    """torch CPU threads (0 = ``OMP_NUM_THREADS`` if set, else every core this process may use,
    ``os.sched_getaffinity``; a warning is logged when other processes already load them: :mod:`drmas_train.run.threads`)."""
    progress: bool = True
    """progress bars on the console."""
    tensorboard: bool = True
    """write TensorBoard event files (``false`` turns TensorBoard off even when ``run.loggers`` names it)."""
    loggers: list[str] = field(default_factory=lambda: ["tensorboard"])
    """experiment trackers fed every iteration's metrics besides ``metrics.jsonl``: any of ``tensorboard``,
    ``trackio``, ``wandb``, ``mlflow``, each local or offline by default (:mod:`drmas_train.run.trackers`; the last
    three need ``pip install 'drmas[trackers]'``)."""
    plot: bool = True
    """write reward / grad-norm PNG at the end."""
    save_samples: bool = False
    """write each iteration's samples (prompts, responses, rewards) to ``samples/iter_NNNNNN.jsonl``."""
    health_warn_ratio: float = 4.0
    """warn when one agent's advantage second moment, or its gradient share per loss share, reaches this many
    times the median of the other agents' (:mod:`drmas_train.run.agent_health`; docs/agent-health.md); 0 = never."""
    mode: str = "sync"
    """``sync`` (each iteration generates with the current weights, then updates every model on those samples) or
    ``async`` (a generation side with its own copy of the weights runs up to ``max_staleness`` batches ahead of the
    trainers, through a buffer of whole prompt groups; on the Ray path the engines are that copy: docs/async.md)."""
    max_staleness: int = 0
    """``run.mode: async``: η, the most versions a consumed sample may lag its model's trainer (the same bound for
    every trained model); complete groups beyond it are dropped and counted. 0 = on-policy (async equals sync)."""
    overlap: bool = False
    """``run.mode: async``: play the batches in a generation thread of this process while the trainer updates
    (``true``: generation and training overlap in time; at η >= 1 which weights a batch gets depends on timing, so
    the run is not reproducible bit for bit; on the Ray path with HF engines only) or inline in the trainer's thread
    (``false``: the deterministic interleaved schedule). Each side uses ``run.num_threads`` torch threads.
    docs/async.md, "Overlap"."""
    push_every: dict[str, int] = field(default_factory=dict)
    """``run.mode: async``: model key -> k: push that model's weights to the generation side after every k-th of its
    updates (default 1, every update; a LoRA base's key covers all of its adapters). A model pushed less often
    generates with older weights, so its samples are staler: its pipeline lags the others'. Single-process path
    only. docs/async.md."""
    pacing: str = "lockstep"
    """``run.mode: async`` on Ray: ``lockstep`` (every step waits for every trained model's update) or ``per_model``
    (a step starts the update of every model that is idle and waits only for the first to finish: a model whose
    update takes longer skips steps, its engines generate with its older weights meanwhile, and a faster model runs
    ahead; validation, checkpoints and the last step wait for all). Needs ``distributed.enabled``, ``colocate:
    false`` (groups on bundles of their own), HF engines, no critic and, with several trained models, a per-agent
    grouping without batch whitening. docs/async.md, "Per-model pacing"."""
    generation_restarts: int = 0
    """``run.overlap: true``: how many times, over this process's run, the generation thread plays a batch again
    after it failed (an ``Exception`` from the rollout: the same tasks and seed, so nothing is lost or doubled)
    before the run stops with ``GenerationThreadError``. A batch that failed while its episodes were being put into
    the buffer is never played again: the run stops. 0 = stop at the first failure. docs/async.md, "Overlap"."""


@dataclass
class TrainConfig:
    """The whole training configuration (what is saved in every checkpoint)."""

    seed: int = 0
    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    models: dict[str, ModelConfig] = field(default_factory=dict)
    """model key -> model."""
    agents: dict[str, str] = field(default_factory=dict)
    """env agent id -> model key, or ``<key>:<adapter>`` for one of the model's LoRA adapters (``models.<key>.adapters``)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    """PPO's critic (used by ``algorithm.estimator: gae``)."""
    eval: ValidationConfig = field(default_factory=ValidationConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)


def _configs_dir():
    return Path(__file__).resolve().parents[1] / "configs"  # package data (pyproject: drmas_train/configs/*.yaml)


def list_presets() -> list[str]:
    """Names of the bundled YAML presets (package data, so they work from an installed wheel)."""
    return sorted(p.name[:-5] for p in _configs_dir().iterdir() if p.name.endswith(".yaml"))


def presets_for_env(env_id: str) -> list[str]:
    """The bundled presets whose ``env.id`` is ``env_id`` (``quickstart_*`` first), for error messages."""
    found = []
    for name in list_presets():
        try:
            node = _read_yaml(name)
        except ConfigError:
            continue
        if OmegaConf.select(node, "env.id", default=EnvConfig.id) == env_id:
            found.append(name)
    return sorted(found, key=lambda n: (not n.startswith("quickstart"), n))


def preset_path(name_or_path: str) -> Any:
    """Resolve ``name_or_path``: an existing YAML file, else a bundled preset name (``.yaml`` optional).

    Raises:
        ConfigError: neither; lists the presets and suggests the closest.
    """
    path = Path(name_or_path)
    if path.is_file():
        return path
    stem = path.name[:-5] if path.name.endswith(".yaml") else path.name
    candidate = _configs_dir() / f"{stem}.yaml"
    if candidate.is_file():
        return candidate
    presets = list_presets()
    close = difflib.get_close_matches(stem, presets, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"config {name_or_path!r} is neither a YAML file nor a preset; presets: {presets}.{hint}")


#: top-level mappings that a child preset (``extends:``) replaces instead of merging into.
_REPLACED_ON_EXTEND = ("models", "agents")


def _read_yaml(name_or_path: str, seen: tuple[str, ...] = ()) -> DictConfig:
    src = preset_path(name_or_path)
    try:
        node = OmegaConf.create(src.read_text())
    except Exception as err:  # yaml parse errors
        raise ConfigError(f"cannot parse config {src}: {err}") from err
    if not isinstance(node, DictConfig):
        raise ConfigError(f"config {src} must be a YAML mapping, got {type(node).__name__}")
    base = node.pop("extends", None)
    if base is None:
        return node
    if base in seen:
        raise ConfigError(f"config {src}: 'extends' cycle through {list(seen) + [base]}")
    parent = _read_yaml(str(base), (*seen, str(base)))
    for key in _REPLACED_ON_EXTEND:  # an assignment is replaced whole, never merged key by key
        if key in node and key in parent:
            parent.pop(key)
    return OmegaConf.merge(parent, node)


def load_config(config: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Build a validated :class:`TrainConfig` from a preset or YAML file plus dotted ``key=value`` overrides.

    Args:
        config: preset name (``quickstart_math``) or YAML path; None = :data:`DEFAULT_PRESET`.
        overrides: OmegaConf dotlist, e.g. ``["rollout.group_size=4", "models.shared.lr=2e-6"]``.

    Raises:
        ConfigError: unknown key, wrong type, bad value (see :func:`validate_config`); before any model loads.
    """
    schema = OmegaConf.structured(TrainConfig)
    try:
        merged = OmegaConf.merge(schema, _read_yaml(config or DEFAULT_PRESET))
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"override {item!r} must look like key=value (e.g. rollout.group_size=4)")
        merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(list(overrides)))
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise ConfigError(omegaconf_message(err)) from None
    assert isinstance(cfg, TrainConfig)
    if cfg.run.name is None:
        cfg.run.name = Path(config or DEFAULT_PRESET).name.removesuffix(".yaml")
    validate_config(cfg)
    return cfg


def omegaconf_message(err: OmegaConfBaseException) -> str:
    """One line for an OmegaConf key or type error: the dotted key, what was wrong, the closest valid key and the
    section's valid keys (OmegaConf's own message adds its internals, ``full_key`` / ``object_type``, on more lines)."""
    what = str(getattr(err, "msg", None) or err).splitlines()[0].strip()
    key = getattr(err, "full_key", None)
    section = getattr(err, "object_type", None)
    if not key:
        return f"invalid config: {what}"
    valid = [f.name for f in dataclasses.fields(section)] if dataclasses.is_dataclass(section) else []
    parent = key.rpartition(".")[0] or "the top level"
    if "not in" in what:  # an unknown key: the suggestion OmegaConf found, then every key of that section
        hint = what.partition(". ")[2]
        return f"unknown config key {key!r}.{' ' + hint if hint else ''} Valid keys of {parent}: {', '.join(valid)}"
    return f"invalid config value for {key!r}: {what}"


def min_group_size(estimator: str) -> int:
    """The fewest rollouts per task (``rollout.group_size``) ``estimator`` can learn from: 2 where its baseline is a
    statistic of the task's group (GRPO, Dr. MAS, RLOO, GiGPO, ...: a group of one compares a rollout with itself),
    1 where it is not: no groups (``reinforce_pp``), a critic (``gae``) or a greedy rollout (``remax``)
    (:data:`drmas_train.algorithm.advantages.DEFAULT_GROUPING`, ``needs_critic``, ``needs_greedy_baseline``).

    Raises:
        ValueError: an unknown estimator (as :func:`~drmas_train.algorithm.advantages.get_estimator`).
    """
    from drmas_train.algorithm.advantages import DEFAULT_GROUPING, needs_critic, needs_greedy_baseline

    own_baseline = needs_critic(estimator) or needs_greedy_baseline(estimator)
    return 1 if own_baseline or DEFAULT_GROUPING.get(estimator) is None else 2


def _validate_group_size(group_size: int, estimator: str) -> None:
    """``rollout.group_size`` against :func:`min_group_size`: one rule per estimator, so 0 and 1 get one message."""
    least = min_group_size(estimator)
    why = ("its baseline is a statistic of the task's group of rollouts: one rollout per task leaves no other to "
           "compare with" if least == 2 else "every task needs a rollout")  # fmt: skip
    require(group_size >= least, f"rollout.group_size must be >= {least} for algorithm.estimator={estimator!r}, got "
            f"{group_size} ({why}); accepted: {least} or more")  # fmt: skip


def validate_config(cfg: TrainConfig, env_agents: list[str] | None = None) -> None:
    """Check every section (each section's own ``validate``) and what spans sections (OmegaConf already checked
    keys and types).

    Args:
        env_agents: the env's ``possible_agents``; when given, every one must have a model and no other
            agent may be named.

    Raises:
        ConfigError: naming the key, the bad value and what is accepted.
    """
    cfg.algorithm.validate()
    cfg.optim.validate()
    cfg.critic.validate()
    _validate_group_size(cfg.rollout.group_size, cfg.algorithm.estimator)
    cfg.rollout.validate()
    require(cfg.algorithm.overlong_buffer <= cfg.rollout.max_new_tokens,
            f"algorithm.overlong_buffer={cfg.algorithm.overlong_buffer} exceeds rollout.max_new_tokens="
            f"{cfg.rollout.max_new_tokens}: the penalty zone is the last overlong_buffer tokens before the limit; "
            f"accepted: 0 (off) to {cfg.rollout.max_new_tokens}")  # fmt: skip
    cfg.eval.validate()
    cfg.distributed.validate(list(cfg.models))
    from drmas_train.run.trackers import check_trackers

    check_trackers(list(cfg.run.loggers))  # an unknown logger, or its library missing: before any model loads
    require(cfg.run.num_threads >= 0, f"run.num_threads must be >= 0 (0 = all available cores), got {cfg.run.num_threads}")
    require(cfg.run.iterations >= 1, f"run.iterations must be >= 1, got {cfg.run.iterations}")
    _validate_run_mode(cfg)
    require(cfg.run.health_warn_ratio == 0 or cfg.run.health_warn_ratio > 1,
            f"run.health_warn_ratio must be 0 (never warn) or > 1, got {cfg.run.health_warn_ratio}")  # fmt: skip
    require(bool(cfg.models), "no models: define at least one under 'models:' (e.g. models.shared.name_or_path=...)")
    require(bool(cfg.agents), "no agents: map each env agent to a model key under 'agents:' (e.g. agents.solver=shared)")
    for key, m in cfg.models.items():
        m.validate(key)
        require(m.backend in LOCAL_BACKENDS, f"models.{key}.backend={m.backend!r}; accepted: {', '.join(LOCAL_BACKENDS)}")
    for agent, name in cfg.agents.items():
        key, adapter = split_model_id(str(name))
        if key not in cfg.models:
            close = difflib.get_close_matches(key, cfg.models, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"agents.{agent}={name!r} names no model; defined models: {sorted(cfg.models)}.{hint}")
        adapters = sorted(cfg.models[key].adapters)
        if adapter is None:
            require(not adapters, f"agents.{agent}={name!r}: models.{key} holds adapters {adapters}; name one, e.g. "
                    f"agents.{agent}={key}:{adapters[0] if adapters else ''}")  # fmt: skip
        else:
            require(bool(adapters), f"agents.{agent}={name!r}: models.{key} has no adapters; name the model alone "
                    f"(agents.{agent}={key}) or define models.{key}.adapters.{adapter}")  # fmt: skip
            require(adapter in adapters, f"agents.{agent}={name!r}: models.{key} has no adapter {adapter!r}; its "
                    f"adapters: {adapters}")  # fmt: skip
    if cfg.algorithm.estimator == "gae":
        with_adapters = sorted(key for key, m in cfg.models.items() if m.adapters)
        require(not with_adapters, f"algorithm.estimator=gae with models.{with_adapters[0] if with_adapters else ''}"
                ".adapters: a critic starts from its policy's weights, and several adapters share one base; give "
                "each agent a model of its own (or one LoRA per model: models.<key>.lora) with the gae estimator")  # fmt: skip
    if cfg.distributed.enabled:
        _validate_distributed_run(cfg)
    if env_agents is not None:
        extra, missing = agent_mismatch(cfg.agents, env_agents)
        require(not missing, f"env {cfg.env.id!r} agent(s) {missing} have no model; add agents.<agent>=<model key>")
        require(not extra, f"agents {extra} are not agents of env {cfg.env.id!r}; its agents: {list(env_agents)}")


def _validate_run_mode(cfg: TrainConfig) -> None:
    """``run.mode`` and ``run.max_staleness``, and what ``run.mode: async`` does not support yet (docs/async.md)."""
    mode = cfg.run.mode
    require(mode in RUN_MODES, f"run.mode={mode!r}; accepted: {', '.join(RUN_MODES)}")
    eta = cfg.run.max_staleness
    require(not isinstance(eta, bool) and isinstance(eta, int) and eta >= 0,
            f"run.max_staleness must be an int >= 0 (versions a consumed sample may lag), got {eta!r}")  # fmt: skip
    require(isinstance(cfg.run.overlap, bool), f"run.overlap must be true or false, got {cfg.run.overlap!r}")
    restarts = cfg.run.generation_restarts
    require(not isinstance(restarts, bool) and isinstance(restarts, int) and restarts >= 0,
            f"run.generation_restarts must be an int >= 0 (replays of a failed generation batch), got {restarts!r}")  # fmt: skip
    require(restarts == 0 or cfg.run.overlap, f"run.generation_restarts={restarts} without run.overlap=true: it "
            "restarts the asynchronous loop's generation thread; set run.mode=async and run.overlap=true, or leave "
            "it at 0")  # fmt: skip
    push_every = cfg.run.push_every
    require(isinstance(push_every, dict), f"run.push_every must be a mapping model key -> int >= 1, got {push_every!r}")
    require(mode == "async" or not push_every, f"run.push_every with run.mode={mode!r}: it schedules the asynchronous "
            "loop's weight pushes; set run.mode=async or leave it empty")  # fmt: skip
    for key, k in push_every.items():
        model = cfg.models.get(key)
        require(model is not None and model.trainable, f"run.push_every.{key}: not a trained model; accepted: "
                f"{sorted(m for m, c in cfg.models.items() if c.trainable)}")  # fmt: skip
        require(not isinstance(k, bool) and isinstance(k, int) and k >= 1,
                f"run.push_every.{key} must be an int >= 1 (updates between two pushes), got {k!r}")  # fmt: skip
        # between two pushes the model's freshest sample lags by up to k - 1 versions: beyond η no group is usable
        require(k <= eta + 1, f"run.push_every.{key}={k} with run.max_staleness={eta}: the model's samples would lag "
                f"by up to {k - 1} version{'s' if k > 2 else ''}, more than the bound, and every group would be dropped; use "
                f"run.push_every.{key} <= {eta + 1} or raise run.max_staleness")  # fmt: skip
    _validate_pacing(cfg)
    if mode != "async":
        require(not cfg.run.overlap, f"run.overlap=true with run.mode={mode!r}: overlap is the asynchronous loop's "
                "generation thread; set run.mode=async (with run.max_staleness >= 1 for generation to run ahead)")  # fmt: skip
        return
    require(not (cfg.distributed.enabled and cfg.run.overlap and cfg.distributed.generation_engine == "vllm"),
            "run.overlap=true with distributed.generation_engine=vllm: vLLM engines sleep while the ranks train, "
            "which would take them from the generation thread; use distributed.generation_engine=hf or "
            "run.overlap=false")  # fmt: skip
    require(not (cfg.distributed.enabled and any(k != 1 for k in push_every.values())), "run.push_every with "
            "distributed.enabled=true: on the Ray path the validation generates with the engines, which must hold the "
            "trainer's weights; leave run.push_every empty (every update) or use distributed.enabled=false")  # fmt: skip
    require(not cfg.rollout.filter_groups, "run.mode=async with rollout.filter_groups: DAPO's dynamic sampling draws "
            "more batches inside one iteration, which the asynchronous loop does not do yet; use run.mode=sync")  # fmt: skip
    require(not needs_greedy_baseline(cfg.algorithm.estimator), f"run.mode=async with algorithm.estimator="
            f"{cfg.algorithm.estimator!r}: its greedy baseline is generated with the trainer's weights, per batch, "
            "which the asynchronous loop does not do yet; use run.mode=sync")  # fmt: skip
    for key, m in cfg.models.items():
        require(m.backend == "hf", f"models.{key}.backend={m.backend!r} with run.mode=async; accepted: hf (the "
                "generation side holds its own in-process copy of the weights)")  # fmt: skip


def _validate_pacing(cfg: TrainConfig) -> None:
    """``run.pacing`` and what ``per_model`` needs (docs/async.md, "Per-model pacing")."""
    pacing = cfg.run.pacing
    require(pacing in PACINGS, f"run.pacing={pacing!r}; accepted: {', '.join(PACINGS)}")
    if pacing == "lockstep":
        return
    d = cfg.distributed
    require(cfg.run.mode == "async", f"run.pacing=per_model with run.mode={cfg.run.mode!r}: each model's own pace is "
            "the asynchronous loop's; set run.mode=async")  # fmt: skip
    require(d.enabled and not d.colocate, "run.pacing=per_model needs distributed.enabled=true and "
            "distributed.colocate=false: models whose updates overlap in time train on bundles of their own "
            f"(got enabled={d.enabled}, colocate={d.colocate})")  # fmt: skip
    require(d.generation_engine == "hf", "run.pacing=per_model with distributed.generation_engine=vllm: a vLLM engine "
            "sleeps while its ranks train, so its model could not generate during its update; use "
            "distributed.generation_engine=hf")  # fmt: skip
    require(not needs_critic(cfg.algorithm.estimator), f"run.pacing=per_model with algorithm.estimator="
            f"{cfg.algorithm.estimator!r}: the critics' update is one step for all models; use run.pacing=lockstep")  # fmt: skip
    trained = [k for k, m in cfg.models.items() if m.trainable]
    grouping = effective_grouping(cfg.algorithm.estimator, cfg.algorithm.grouping)
    require(len(trained) < 2 or grouping not in POOLED_GROUPINGS, f"run.pacing=per_model with grouping {grouping!r} "
            f"and {len(trained)} trained models: its statistics pool the agents of several models, whose parts of a "
            f"group would be consumed at different steps; accepted: a per-agent grouping "
            f"({', '.join(g for g in GROUPINGS if g not in POOLED_GROUPINGS)})")  # fmt: skip
    require(len(trained) < 2 or cfg.algorithm.scale != "batch_std", f"run.pacing=per_model with algorithm.scale="
            f"batch_std and {len(trained)} trained models: its std pools the whole batch, whose models would differ "
            "from step to step; accepted: algorithm.scale std or mean, or run.pacing=lockstep")  # fmt: skip
    require(len(trained) < 2 or cfg.algorithm.estimator not in BATCH_WHITENED, f"run.pacing=per_model with "
            f"algorithm.estimator={cfg.algorithm.estimator!r} and {len(trained)} trained models: it whitens over the "
            "whole batch, whose models would differ from step to step; use another estimator or run.pacing=lockstep")  # fmt: skip


def _validate_distributed_run(cfg: TrainConfig) -> None:
    """What ``distributed.enabled: true`` asks of the other sections."""
    if cfg.distributed.generation_engine == "vllm":
        r = cfg.rollout
        require(r.top_k == -1 and r.top_p == 1.0, f"rollout.top_k={r.top_k}, rollout.top_p={r.top_p} with "
                "distributed.generation_engine=vllm; accepted: top_k=-1, top_p=1.0 (vLLM's log-probs are taken after "
                "top-k/top-p filtering, not the drmas convention; use generation_engine=hf to train with them)")  # fmt: skip
    for key, m in cfg.models.items():
        require(not m.adapters, f"models.{key}.adapters with distributed.enabled=true: the adapters of one base train "
                "in one process (a worker group per adapter would load the base again); use distributed.enabled=false, "
                f"or give each agent a model of its own")  # fmt: skip
        require(m.backend == "hf", f"models.{key}.backend={m.backend!r} with distributed.enabled=true; accepted: hf "
                "(the driver's copy; vLLM generation workers: distributed.generation_engine=vllm)")  # fmt: skip
        require(m.device == "cpu", f"models.{key}.device={m.device!r} with distributed.enabled=true; leave it 'cpu': "
                "workers use a GPU when distributed.devices_per_node > 0")  # fmt: skip


def to_yaml(cfg: TrainConfig) -> str:
    """The resolved config as YAML (logged at start, saved in every checkpoint)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def from_yaml(text: str) -> TrainConfig:
    """Inverse of :func:`to_yaml` (used by ``--resume``)."""
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.create(text)))
    validate_config(cfg)
    return cfg


def as_dict(cfg: TrainConfig) -> dict[str, Any]:
    """Plain nested dict of ``cfg``."""
    return dataclasses.asdict(cfg)
