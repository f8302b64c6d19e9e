"""Typed training configuration: dataclasses + OmegaConf structured configs, YAML presets, dotted overrides.

One source for every default: the dataclass fields below (each documented). A preset in ``drmas_train/configs/``
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
from typing import Any, Union

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from drmas_train.backends.base import LOCAL_BACKENDS, TRUNCATION_MODES
from drmas_train.model.assignment import agent_mismatch
from drmas_train.model.models import DTYPES

__all__ = [
    "ConfigError",
    "LoraConfig",
    "ModelConfig",
    "EnvConfig",
    "RolloutConfig",
    "AlgorithmConfig",
    "OptimConfig",
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


class ConfigError(ValueError):
    """The training configuration is invalid; the message names the key, the bad value and what is accepted."""


@dataclass
class LoraConfig:
    """LoRA adapter settings (peft ``LoraConfig``; Hu et al. 2021, arXiv 2106.09685)."""

    r: int = 16
    """adapter rank."""
    alpha: int = 32
    """scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """dropout on the adapter input."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """module names that get adapters."""


@dataclass
class ModelConfig:
    """One model of the agent -> model assignment; agents naming the same model key share its weights."""

    name_or_path: str = "smollm2-135m-instruct"
    """a named offline model (``smollm2-135m-instruct``, ``tiny-qwen3``, ...), a local path or an HF id."""
    dtype: str = "float32"
    """``float32`` | ``bfloat16`` | ``float16``."""
    device: str = "cpu"
    """torch device, e.g. ``cpu`` or ``cuda:0``."""
    backend: str = "hf"
    """rollout backend: ``hf`` (transformers, the default) or ``vllm``."""
    trainable: bool = True
    """False: the model acts but is never updated (a frozen agent)."""
    lora: LoraConfig | None = None
    """train LoRA adapters instead of all weights (null = full fine-tuning)."""
    lr: float | None = None
    """per-model override of ``optim.lr``."""
    weight_decay: float | None = None
    """per-model override of ``optim.weight_decay``."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """passed to the chat template (e.g. ``{enable_thinking: false}`` for Qwen3)."""


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
class RolloutConfig:
    """Sampling and batch shape of one iteration (N tasks x G rollouts)."""

    batch_size: int = 4
    """N: tasks per iteration (the paper's "prompts per iteration")."""
    group_size: int = 4
    """G: rollouts per task sharing one ``uid`` (GRPO group size n)."""
    temperature: float = 1.0
    """sampling temperature (> 0 for training)."""
    top_p: float = 1.0
    """nucleus mass in (0, 1]."""
    top_k: int = -1
    """-1 = off."""
    max_new_tokens: int = 256
    """response length limit per agent call, in tokens."""
    max_prompt_tokens: int = 2048
    """prompt length limit per agent call, in tokens."""
    truncation: str = "left"
    """``left`` | ``middle`` | ``error`` (see :func:`drmas_train.backends.base.truncate_ids`)."""


@dataclass
class AlgorithmConfig:
    """Advantage estimator and PPO loss (defaults: the Dr. MAS / verl reference)."""

    estimator: str = "drmas"
    """``drmas`` | ``grpo`` | ``grpo_step`` | ``per_turn`` (:mod:`drmas_train.algorithm.advantages`)."""
    norm_by_std: bool = True
    """divide by the group std (False = Dr. GRPO, arXiv 2503.20783)."""
    eps: float = 1e-6
    """added to the std."""
    unbiased_std: bool = True
    """n-1 std as the reference (``torch.std``)."""
    singleton: str = "zero"
    """advantage of a group with one valid member: ``"zero"`` (drmas: A = 0, nothing to compare with) or
    ``"raw"`` (the reference: the score over 1 + eps); see :mod:`drmas_train.algorithm.advantages` and docs/fidelity.md."""
    ppo_epochs: int = 1
    """passes over each iteration's samples."""
    mini_batches: int = 1
    """optimizer steps per epoch (the batch is split into this many mini-batches)."""
    clip_low: float = 0.2
    """PPO lower clip epsilon."""
    clip_high: float = 0.2
    """PPO upper clip epsilon (DAPO clip-higher: 0.28)."""
    dual_clip_c: float | None = 3.0
    """dual-clip constant (null = off)."""
    loss_agg: str = "token-mean"
    """``token-mean`` | ``seq-mean-token-mean`` | ``seq-mean-token-sum``."""
    kl_coef: float = 0.0
    """KL(pi || pi_ref) weight; 0 = off (reference default). > 0 keeps a frozen copy of each trained model."""
    kl_estimator: str = "k3"
    """``k1`` | ``k3``."""
    entropy_coef: float = 0.0
    """entropy bonus weight."""
    recompute_old_logprobs: bool = True
    """True (the reference): before the update, recompute π_old's log-probs with the training model
    (:mod:`drmas_train.algorithm.old_logprobs`; langfengQ/DrMAS verl/trainer/ppo/ray_trainer.py:1265) and log the mismatch with
    the rollout engine's (``loss/<model>/old_logprob_abs_diff_max`` / ``_mean``); False: use the engine's log-probs
    as π_old (saves one forward pass; the first PPO ratio then also carries the engine/trainer drift)."""


@dataclass
class OptimConfig:
    """AdamW per trainable model (defaults from the reference: lr 1e-6, weight decay 0.01)."""

    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_steps: int = 0
    """linear warm-up, in optimizer steps; constant afterwards."""
    grad_clip: float = 1.0
    """max total grad norm per model (the pre-clip norm is logged)."""
    micro_batch_tokens: Union[int, str] = 2048  # noqa: UP007 (OmegaConf reads typing.Union, not int | str)
    """token budget (padded prompt + response tokens; a group's shared prompt counts once) of one forward/backward
    micro-batch, or ``auto``: chosen from the free memory (:mod:`drmas_train.algorithm.memory_budget`). Saved activations
    cost about 1.3 MB per token for SmolLM2-135M in float32 (docs/update-performance.md), so 2048 keeps them near
    2.6 GB; larger budgets barely speed up a CPU update."""
    activation_checkpointing: int = 0
    """0 = off; k = recompute every k-th decoder layer in the backward (about 18x less activation memory at k = 1
    for a third more forward compute; group prompts are then not shared)."""
    autocast: str = "off"
    """``off`` | ``bf16`` | ``auto`` (bf16 where matmuls are native bf16: CUDA or AMX CPUs;
    :mod:`drmas_train.algorithm.precision`)."""


@dataclass
class ValidationConfig:
    """Periodic validation during training (the ``eval:`` section): avg@k / pass@k on held-out tasks.

    Not to be confused with :class:`drmas_train.eval.evaluate.EvalConfig`, the configuration of ``drmas eval``.
    """

    every: int = 0
    """iterations between evaluations (0 = never; also run at the end when > 0)."""
    data: str | None = None
    """task source (default: ``env.data``)."""
    size: int = 16
    """number of validation tasks (the first ``size`` of the source)."""
    k: int = 4
    """samples per task (avg@k / pass@k); the reference evaluates with 16
    (langfengQ/DrMAS examples/drmas_trainer/run_math.sh:11, run_search.sh:11)."""
    temperature: float = 1.0
    """sampling temperature of validation (the reference presets: 0.6, run_math.sh:77)."""
    top_p: float = 1.0
    """nucleus mass in (0, 1] of validation, independent of ``rollout.top_p`` (the reference presets: 0.95,
    run_math.sh:76)."""
    top_k: int = -1
    """-1 = off."""
    before_train: bool = False
    """also evaluate the initial weights, logged as iteration 0 (when ``every`` > 0 and not resuming); the
    reference's ``trainer.val_before_train=True`` (run_math.sh:100)."""


@dataclass
class RunConfig:
    """Iterations, outputs and bookkeeping."""

    iterations: int = 10
    """training iterations (one rollout + update each)."""
    dir: str = "runs/drmas"
    """run directory: metrics.jsonl, tensorboard/, checkpoints/, plots."""
    save_every: int = 0
    """checkpoint every this many iterations (0 = only at the end)."""
    keep_checkpoints: int = 2
    """how many most recent checkpoints to keep."""
    num_threads: int = 0
    """torch CPU threads (0 = ``OMP_NUM_THREADS`` if set, else every core this process may use,
    ``os.sched_getaffinity``; a warning is logged when other processes already load them: :mod:`drmas_train.run.threads`)."""
    progress: bool = True
    """progress bars on the console."""
    tensorboard: bool = True
    """write TensorBoard event files."""
    plot: bool = True
    """write reward / grad-norm PNG at the end."""
    save_samples: bool = False
    """write each iteration's samples (prompts, responses, rewards) to ``samples/iter_NNNNNN.jsonl``."""


#: accepted ``distributed.strategy`` values (see :class:`DistributedConfig`).
DISTRIBUTED_STRATEGIES = ("auto", "fsdp2", "ddp")
#: accepted ``distributed.generation_engine`` values (see :class:`DistributedConfig`).
GENERATION_ENGINES = ("hf", "vllm")


@dataclass
class DistributedConfig:
    """Scale-out on Ray (:mod:`drmas_train.distributed`); off by default: the single-process path is unchanged.

    Each model gets one worker group: ``world_size[model]`` training ranks (one ``torch.distributed`` process
    group, gloo on CPU, NCCL on GPU) and as many generation workers, placed on the bundles of one resource pool
    (one bundle = ``cpus_per_worker`` CPUs and, on GPU nodes, one GPU).
    """

    enabled: bool = False
    """train through Ray worker groups instead of in this process."""
    address: str | None = None
    """null: start a local Ray (127.0.0.1 only, no dashboard unless ``dashboard``); else ``ray.init(address=...)``
    (e.g. ``auto`` or ``ray://head:10001``)."""
    num_nodes: int = 1
    """nodes the pool spans (>= 1)."""
    devices_per_node: int = 0
    """GPUs per node, one per bundle; 0 = CPU-only workers (gloo), one bundle per ``cpus_per_worker`` CPUs."""
    cpus_per_worker: int = 1
    """CPUs per bundle (>= 1); also the torch threads of each worker."""
    colocate: bool = True
    """every model's worker group on the same bundles, taking turns (Dr. MAS shared resource scheduling);
    false = the pool is split between the models."""
    world_size: dict[str, int] = field(default_factory=dict)
    """model key -> training ranks (default: all bundles when colocated, else an even split)."""
    strategy: str = "auto"
    """``auto`` | ``fsdp2`` | ``ddp``; auto = FSDP2 ``fully_shard`` (works on CUDA/NCCL and, with torch >= 2.6,
    on CPU/gloo)."""
    max_restarts: int = 2
    """bounded restarts per run: of generation workers (Ray ``max_restarts``; their owed calls are re-issued) and
    of training groups (rebuilt from the latest checkpoint, the trainer replays from it)."""
    dashboard: bool = False
    """start the Ray dashboard with a local Ray."""
    generation_engine: str = "hf"
    """generation workers: ``hf`` (transformers, CPU or GPU) or ``vllm`` (GPU workers, ``devices_per_node > 0``, unless
    ``vllm_allow_cpu``; sleeps while the training ranks on its GPU run, :mod:`drmas_train.distributed.vllm_worker`)."""
    vllm_allow_cpu: bool = False
    """allow ``generation_engine: vllm`` on CPU-only workers (``devices_per_node: 0``) with vLLM's CPU build: for dress
    rehearsals and checks of the vLLM path on a machine without GPUs (slow; no sleep mode on CPU, so the engines
    stay awake beside the training ranks). See ``drmas_train.distributed.vllm_cpu``."""
    vllm_python: str | None = None
    """the Python interpreter of the vLLM generation workers (Ray ``runtime_env.py_executable``): a separate venv with
    vLLM, the driver's Ray version and drmas (``scripts/vllm_cpu_check.sh`` builds one with ``vllm-cpu``). null: the
    driver's interpreter."""
    vllm_gpu_memory_utilization: float = 0.5
    """the share of each GPU, in (0, 1], that the awake vLLM engines on it take together (weights + KV cache); with
    ``colocate: true`` each model's engine gets ``1 / models`` of it (``vllm.LLM(gpu_memory_utilization=...)``). It
    must fit beside the training ranks' resident state (docs/scaling.md)."""
    vllm_sleep_level: int = 1
    """``LLM.sleep(level)`` before each update: 1 = weights to CPU memory, 2 = weights dropped (less host memory;
    every push overwrites them anyway)."""
    vllm_kwargs: dict[str, Any] = field(default_factory=dict)
    """more ``vllm.LLM`` arguments (``enforce_eager``, ``max_model_len`` (default: ``rollout.max_prompt_tokens +
    rollout.max_new_tokens``), ``enable_prefix_caching``, ...)."""


@dataclass
class TrainConfig:
    """The whole training configuration (what is saved in every checkpoint)."""

    seed: int = 0
    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    models: dict[str, ModelConfig] = field(default_factory=dict)
    """model key -> model."""
    agents: dict[str, str] = field(default_factory=dict)
    """env agent id -> model key."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
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
        raise ConfigError(f"invalid config: {err}") from err
    assert isinstance(cfg, TrainConfig)
    validate_config(cfg)
    return cfg


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def validate_config(cfg: TrainConfig, env_agents: list[str] | None = None) -> None:
    """Check values and cross-references (OmegaConf already checked keys and types).

    Args:
        env_agents: the env's ``possible_agents``; when given, every one must have a model and no other
            agent may be named.

    Raises:
        ConfigError: naming the key, the bad value and what is accepted.
    """
    from drmas_train.algorithm.advantages import SINGLETON_MODES, get_estimator
    from drmas_train.algorithm.losses import AGG_MODES, KL_ESTIMATORS

    try:
        get_estimator(cfg.algorithm.estimator)
    except ValueError as err:
        raise ConfigError(f"algorithm.estimator: {err}") from None
    a, r, o = cfg.algorithm, cfg.rollout, cfg.optim
    _check(a.loss_agg in AGG_MODES, f"algorithm.loss_agg={a.loss_agg!r}; accepted: {list(AGG_MODES)}")
    _check(a.singleton in SINGLETON_MODES, f"algorithm.singleton={a.singleton!r}; accepted: {', '.join(SINGLETON_MODES)}")
    _check(a.kl_estimator in KL_ESTIMATORS, f"algorithm.kl_estimator={a.kl_estimator!r}; accepted: {list(KL_ESTIMATORS)}")
    _check(a.eps >= 0, f"algorithm.eps must be >= 0, got {a.eps}")
    _check(a.dual_clip_c is None or a.dual_clip_c > 1, f"algorithm.dual_clip_c must be > 1 or null, got {a.dual_clip_c}")
    for key, value in (("ppo_epochs", a.ppo_epochs), ("mini_batches", a.mini_batches)):
        _check(value >= 1, f"algorithm.{key} must be >= 1, got {value}")
    for key in ("batch_size", "group_size", "max_new_tokens", "max_prompt_tokens"):
        _check(getattr(r, key) >= 1, f"rollout.{key} must be >= 1, got {getattr(r, key)}")
    _check(r.group_size >= 2, f"rollout.group_size must be >= 2, got {r.group_size}: group baselines (GRPO, Dr. MAS) "
           "compare rollouts of the same task, so one rollout per task gives no learning signal; accepted: 2 or more")
    _check(r.temperature > 0, f"rollout.temperature must be > 0 for training, got {r.temperature}")
    _check(r.truncation in TRUNCATION_MODES, f"rollout.truncation={r.truncation!r}; accepted: {', '.join(TRUNCATION_MODES)}")
    _check(o.lr > 0 and o.grad_clip > 0, f"optim.lr and optim.grad_clip must be > 0, got {o.lr}, {o.grad_clip}")
    _check(len(o.betas) == 2, f"optim.betas must be two numbers, got {o.betas}")
    _check(o.micro_batch_tokens == "auto" or (isinstance(o.micro_batch_tokens, int) and o.micro_batch_tokens >= 1),
           f"optim.micro_batch_tokens must be an int >= 1 or 'auto', got {o.micro_batch_tokens!r}")  # fmt: skip
    _check(o.autocast in ("off", "bf16", "auto"), f"optim.autocast={o.autocast!r}; accepted: off, bf16, auto")
    _check(o.activation_checkpointing >= 0, f"optim.activation_checkpointing must be >= 0, got {o.activation_checkpointing}")
    _check(cfg.run.num_threads >= 0, f"run.num_threads must be >= 0 (0 = all available cores), got {cfg.run.num_threads}")
    _check(cfg.run.iterations >= 1, f"run.iterations must be >= 1, got {cfg.run.iterations}")
    _check(cfg.eval.k >= 1 and cfg.eval.size >= 1, "eval.k and eval.size must be >= 1")
    _check(cfg.eval.temperature >= 0, f"eval.temperature must be >= 0 (0 = greedy), got {cfg.eval.temperature}")
    _check(0 < cfg.eval.top_p <= 1, f"eval.top_p must be in (0, 1], got {cfg.eval.top_p}")
    _check(0 < r.top_p <= 1, f"rollout.top_p must be in (0, 1], got {r.top_p}")
    _check(bool(cfg.models), "no models: define at least one under 'models:' (e.g. models.shared.name_or_path=...)")
    _check(bool(cfg.agents), "no agents: map each env agent to a model key under 'agents:' (e.g. agents.solver=shared)")
    for agent, key in cfg.agents.items():
        if key not in cfg.models:
            close = difflib.get_close_matches(str(key), cfg.models, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"agents.{agent}={key!r} names no model; defined models: {sorted(cfg.models)}.{hint}")
    for key, m in cfg.models.items():
        _check(m.dtype in DTYPES, f"models.{key}.dtype={m.dtype!r}; accepted: {', '.join(DTYPES)}")
        _check(m.backend in LOCAL_BACKENDS, f"models.{key}.backend={m.backend!r}; accepted: {', '.join(LOCAL_BACKENDS)}")
    _validate_distributed(cfg)
    if env_agents is not None:
        extra, missing = agent_mismatch(cfg.agents, env_agents)
        _check(not missing, f"env {cfg.env.id!r} agent(s) {missing} have no model; add agents.<agent>=<model key>")
        _check(not extra, f"agents {extra} are not agents of env {cfg.env.id!r}; its agents: {list(env_agents)}")


def _validate_distributed(cfg: TrainConfig) -> None:
    d = cfg.distributed
    for key in ("num_nodes", "cpus_per_worker"):
        _check(getattr(d, key) >= 1, f"distributed.{key} must be >= 1, got {getattr(d, key)}")
    _check(d.devices_per_node >= 0, f"distributed.devices_per_node must be >= 0 (0 = CPU-only), got {d.devices_per_node}")
    _check(d.max_restarts >= 0, f"distributed.max_restarts must be >= 0, got {d.max_restarts}")
    _check(d.strategy in DISTRIBUTED_STRATEGIES, f"distributed.strategy={d.strategy!r}; accepted: {list(DISTRIBUTED_STRATEGIES)}")
    _check(d.generation_engine in GENERATION_ENGINES,
           f"distributed.generation_engine={d.generation_engine!r}; accepted: {list(GENERATION_ENGINES)}")  # fmt: skip
    _check(0 < d.vllm_gpu_memory_utilization <= 1,
           f"distributed.vllm_gpu_memory_utilization must be in (0, 1], got {d.vllm_gpu_memory_utilization}")  # fmt: skip
    _check(d.vllm_sleep_level in (1, 2), f"distributed.vllm_sleep_level must be 1 or 2, got {d.vllm_sleep_level}")
    for key, n in d.world_size.items():
        if key not in cfg.models:
            close = difflib.get_close_matches(str(key), cfg.models, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"distributed.world_size.{key} names no model; defined models: {sorted(cfg.models)}.{hint}")
        _check(isinstance(n, int) and not isinstance(n, bool) and n >= 1, f"distributed.world_size.{key} must be an int >= 1, got {n!r}")
    if not d.enabled:
        return
    if d.generation_engine == "vllm":
        _check(d.devices_per_node > 0 or d.vllm_allow_cpu,
               "distributed.generation_engine=vllm needs GPU workers (distributed.devices_per_node > 0): vLLM and its "
               "sleep mode run on CUDA; on CPU-only workers use distributed.generation_engine=hf, or vLLM's CPU build "
               "with distributed.vllm_allow_cpu=true (rehearsals and checks)")  # fmt: skip
        r = cfg.rollout
        _check(r.top_k == -1 and r.top_p == 1.0, f"rollout.top_k={r.top_k}, rollout.top_p={r.top_p} with "
                                                  "distributed.generation_engine=vllm; accepted: top_k=-1, top_p=1.0 "
                                                  "(vLLM's log-probs are taken after top-k/top-p filtering, not the "
                                                  "drmas convention; use generation_engine=hf to train with them)")  # fmt: skip
    for key, m in cfg.models.items():
        _check(m.backend == "hf", f"models.{key}.backend={m.backend!r} with distributed.enabled=true; accepted: hf "
                                  "(the driver's copy; vLLM generation workers: distributed.generation_engine=vllm)")  # fmt: skip
        _check(m.device == "cpu", f"models.{key}.device={m.device!r} with distributed.enabled=true; leave it 'cpu': "
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
