"""``drmas eval``: evaluate a policy on env ids x task sources and write a results directory.

Examples::

    drmas eval --env math-solver-verifier-v0 --policy oracle --limit 20 --k 4 --out runs/eval/oracle
    drmas eval --env math-solver-verifier-v0 --data ../shared/data/gsm8k_test.jsonl --limit 50 \\
        --policy llm --model smollm2-135m-instruct --k 4 --max-new-tokens 256 --out runs/eval/smollm2
    drmas eval --env math-solver-verifier-v0 --policy llm --model smollm2-135m-instruct \\
        --agent-model verifier=tiny-qwen3 --out runs/eval/hetero
    drmas eval --preset quickstart_math --team solver=runs/quickstart_math/checkpoints/iter_000004,\\
        verifier=runs/quickstart_math --out runs/eval/team        # a checkpoint per role

Results: ``OUT/summary.json`` and ``OUT/episodes.jsonl`` (docs/results-schema.md); rank runs with
``drmas leaderboard``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from drmas_train.commands import HelpFormatter

__all__ = ["main", "build_parser", "add_play_arguments", "check_counts", "config_from_args", "eval_defaults",
           "team_models", "report", "run_settings", "validation_tasks_of"]


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _team(text: str) -> list[tuple[str, str]]:
    """``ROLE=SOURCE[,ROLE=SOURCE...]`` -> ``[(role, source), ...]``."""
    out = []
    for part in text.split(","):
        role, sep, source = part.partition("=")
        if not sep or not role.strip() or not source.strip():
            raise argparse.ArgumentTypeError(f"expected ROLE=MODEL[,ROLE=MODEL...], got {text!r}")
        out.append((role.strip(), source.strip()))
    return out


def eval_defaults() -> dict[str, Any]:
    """The defaults of :class:`~drmas_train.eval.evaluate.EvalConfig`'s fields, by field name: what ``drmas eval``
    uses for a setting that neither a flag nor ``--preset`` gives (the one place they are written, so Python and
    the CLI agree), e.g. ``{"k": 16, "temperature": 0.6, "max_new_tokens": 256, ...}``."""
    from drmas_train.eval.evaluate import EvalConfig

    return {f.name: f.default for f in dataclasses.fields(EvalConfig) if f.default is not dataclasses.MISSING}


def add_play_arguments(p: argparse.ArgumentParser, *, presets: bool = True) -> None:
    """The arguments of how LLM agents are evaluated, shared by ``drmas eval`` and ``drmas crossplay``: env and
    tasks, samples per task, backend, sampling and length limits, seed, batching, threads, output directory
    (``presets``: also ``--preset``). Their defaults are :func:`eval_defaults`."""
    d = eval_defaults()
    if presets:
        p.add_argument("--preset", default=None, metavar="PRESET",
                       help="a training preset or YAML (drmas train --list-presets) whose evaluation this repeats: its "
                            "env id and env arguments, samples per task (eval.k), validation sampling (eval.temperature, "
                            "eval.top_p, eval.top_k), response and prompt limits (rollout.*) and chat-template arguments "
                            "become the defaults, as the reference's eval mode reuses its training script's settings; "
                            "flags given here win")
    if presets:
        env_help = ("env id name-vN (repeat for several); default: the env of --preset, or of the run whose checkpoint "
                    "--model / --team names; required otherwise")
        data_help = ("task source: file path, reasoning_gym:<name>, hf:<id>; repeat; default: the validation tasks of "
                     "--preset (or of the run whose checkpoint --model / --team names), else the env's own tasks")
    else:
        env_help = "env id name-vN (repeat for several); default: the run's env"
        data_help = ("task source: file path, reasoning_gym:<name>, hf:<id>; repeat; default: the run's validation "
                     "tasks")
    p.add_argument("--env", dest="envs", action="append", default=None, metavar="ENV_ID", help=env_help)
    p.add_argument("--data", action="append", default=[], metavar="SPEC", help=data_help)
    p.add_argument("--limit", type=int, default=None,
                   help="first N tasks of each source; default: all (a preset that validated on the env's own tasks: "
                        "its eval.size)")
    p.add_argument("--k", type=int, default=None,
                   help=(f"samples per task (avg@k, pass@k); default: the preset's eval.k, else {d['k']}" if presets
                         else "samples per task (avg@k, pass@k); default: the run's eval.k"))
    p.add_argument("--temperature", type=float, default=None,
                   help=f"sampling temperature (0 = greedy); default: the preset's eval.temperature, else "
                        f"{d['temperature']} (the reference's)")
    p.add_argument("--top-p", type=float, default=None,
                   help=f"nucleus sampling mass in (0, 1]; default: the preset's eval.top_p, else {d['top_p']} (the "
                        "reference's)")
    p.add_argument("--top-k", type=int, default=None,
                   help=f"top-k sampling (-1 = off); default: the preset's eval.top_k, else {d['top_k']}")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="response length limit per agent call, in tokens; default: the preset's rollout.max_new_tokens "
                        f"(4096 for the paper's math presets, 800 for search), else {d['max_new_tokens']} "
                        "(rollout.max_new_tokens's default, the quickstarts' length)")
    p.add_argument("--max-prompt-tokens", type=int, default=None,
                   help="prompt length limit per agent call, in tokens; default: the preset's, else none; longer "
                        "prompts are cut as --truncation says")
    p.add_argument("--truncation", default=None, choices=["left", "middle", "error"],
                   help="how a prompt over --max-prompt-tokens is cut: drop its start, its middle, or refuse; default: "
                        f"the preset's, else {d['truncation']}")
    p.add_argument("--seed", type=int, default=d["seed"], help="seeds sampling and env resets (a run is reproducible)")
    p.add_argument("--batch-tasks", type=int, default=d["batch_tasks"], help="tasks per lock-step rollout batch (policy llm)")
    p.add_argument("--env-kwarg", action="append", default=[], type=_key_value, metavar="KEY=JSON",
                   help="extra env argument, value parsed as JSON when possible (e.g. max_loops=3)")
    p.add_argument("--chat-template-kwarg", action="append", default=[], type=_key_value, metavar="KEY=JSON",
                   help="chat-template argument of every model, value parsed as JSON when possible; repeat "
                        "(e.g. enable_thinking=false for Qwen3 as the reference's presets)")
    p.add_argument("--transcripts", action="store_true", help="store every agent call's text in episodes.jsonl")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``drmas eval``."""
    p = argparse.ArgumentParser(
        prog="drmas eval",
        description="Evaluate a policy (scripted baseline or LLM agents) on env ids x data sources: avg@k, pass@k.",
        formatter_class=HelpFormatter,
    )
    add_play_arguments(p)
    p.add_argument("--policy", default=None, choices=["oracle", "random", "no-search", "llm"],
                   help="who plays: a scripted baseline, or llm (--model / --agent-model / --team); default: llm when "
                        "a model is given, else oracle")
    p.add_argument("--model", default=None, help="model for every agent (policy llm): a name, path or HF id")
    p.add_argument("--agent-model", action="append", default=[], type=_key_value, metavar="AGENT=MODEL",
                   help="per-agent model (policy llm); repeat")
    p.add_argument("--team", action="append", default=[], type=_team, metavar="ROLE=MODEL[,ROLE=MODEL...]",
                   help="per-role players, where MODEL may also be a training run directory (the role's model at its "
                        "latest checkpoint), a checkpoint directory runs/<run>/checkpoints/iter_<N> (the role's model "
                        "in it), or a model folder of a checkpoint .../iter_<N>/models/<key> (that model, whichever role "
                        "it trained: a role swap; LoRA adapters are played on their run's base); overrides "
                        "--agent-model for the roles it names")
    p.add_argument(
        "--backend", default=eval_defaults()["backend"], choices=["hf", "vllm", "openai"],
        help="LLM backend (policy llm): local hf/vllm, or openai = an OpenAI-compatible server at --base-url",
    )
    p.add_argument("--base-url", default=None, help="server URL for --backend openai, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--label", default=None, help="display name on leaderboards")
    p.add_argument("--out", required=True, help="results directory to create (must not hold a run)")
    return p


#: the count flags of ``drmas eval`` and ``drmas crossplay`` (argparse dest -> flag): each at least 1 when given.
COUNT_FLAGS = {"k": "--k", "limit": "--limit", "max_new_tokens": "--max-new-tokens",
               "max_prompt_tokens": "--max-prompt-tokens", "batch_tasks": "--batch-tasks"}


def check_counts(args: argparse.Namespace) -> None:
    """Refuse a count flag below 1 by the flag's name, before anything is read or written.

    Raises:
        ValueError: ``"--k must be >= 1, got 0"`` (the first such flag).
    """
    for dest, flag in COUNT_FLAGS.items():
        value = getattr(args, dest, None)
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")


def _json_or_str(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def preset_defaults(name: str) -> dict[str, Any]:
    """The evaluation settings of a training preset: env id and arguments, samples per task (eval.k), validation
    sampling, response and prompt limits, and the chat-template arguments its models share.

    Raises:
        ValueError: an unknown preset (the message lists them), or models whose chat-template arguments differ.
    """
    from drmas_train.run.config import load_config

    cfg = load_config(name)
    template = {tuple(sorted(m.chat_template_kwargs.items())) for m in cfg.models.values()}
    if len(template) > 1:
        raise ValueError(f"--preset {name}: its models take different chat-template arguments; give --chat-template-kwarg")
    return {"envs": [cfg.env.id], "env_kwargs": dict(cfg.env.kwargs), "k": cfg.eval.k,
            "temperature": cfg.eval.temperature, "top_p": cfg.eval.top_p, "top_k": cfg.eval.top_k,
            "max_new_tokens": cfg.rollout.max_new_tokens,
            "max_prompt_tokens": cfg.rollout.max_prompt_tokens, "truncation": cfg.rollout.truncation,
            "chat_template_kwargs": dict(template.pop()) if template else {}}  # fmt: skip


def validation_tasks_of(args: argparse.Namespace, preset: str) -> str | None:
    """Without ``--data``: make ``args`` play the validation tasks of ``preset`` (a preset name or a run's
    ``config.yaml``), and return a note saying which.

    A preset that validates on a task source (``eval.data``, or a ``env.data`` it holds tasks out of): its validation
    tasks (:func:`drmas_train.run.env_setup.run_validation_tasks`, rebuilt from the config as the trainer builds them)
    are written to ``<out>/validation_tasks.jsonl`` and become ``args.data``. So are held-out questions its env
    generated (the search envs' synthetic encyclopedia, another question seed); they are played about the same
    synthetic world (``--env-kwarg synthetic={}`` is added when the env kwargs name no world, so the default one is
    kept). A preset that validates on the env's own tasks (its first ``eval.size``): ``args.limit`` becomes
    ``eval.size`` unless given. A preset without validation (``eval.every: 0``) or ``--data`` given: nothing changes
    (None).

    Raises:
        ConfigError: the config or its task source does not load.
    """
    import drmas_envs
    from drmas_train.run.config import load_config
    from drmas_train.run.env_setup import (
        game_opponents,
        is_game,
        make_probe_env,
        run_validation_tasks,
        validation_tasks,
    )

    cfg = load_config(preset)
    if args.data or cfg.eval.every <= 0:
        return None
    if not (cfg.eval.data or cfg.env.data):  # the env's own tasks: one env, as build_run builds it
        env = make_probe_env(cfg, lambda: drmas_envs.make(cfg.env.id, **dict(cfg.env.kwargs)))
        if is_game(env):  # one task, the rules: the hands (k) vary, and the run validated per opponent
            return (f"a game: its one task, --k hands (the run validated on {cfg.eval.k} hands against each of "
                    f"{', '.join(game_opponents(cfg))}; --env-kwarg opponent=NAME picks this evaluation's)")  # fmt: skip
        tasks, _ = validation_tasks(cfg, env.tasks, env)
        own = {env.tasks[i].task_id for i in range(min(cfg.eval.size, len(env.tasks)))}
        if not tasks or {t.task_id for t in tasks} == own:
            if args.limit is None:
                args.limit = cfg.eval.size
            return f"tasks: the env's own first {args.limit}, as the run validated on its first {cfg.eval.size}"
        # held-out questions the env generated from another seed: played from a file, about the same synthetic
        # world, whose passages the env keeps as the corpus (SearchTextEnv's `synthetic` with `tasks` given)
        given = list(getattr(args, "env_kwarg", None) or [])
        if "synthetic" not in cfg.env.kwargs and "synthetic" not in {key for key, _ in given}:
            args.env_kwarg = [*given, ("synthetic", "{}")]
    else:
        tasks = run_validation_tasks(cfg)
    path = Path(args.out) / "validation_tasks.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in tasks), encoding="utf-8")
    args.data = [str(path)]
    return f"tasks: the run's {len(tasks)} validation tasks, written to {path} (--data plays others)"


def run_preset_of_models(args: argparse.Namespace) -> str | None:
    """The ``config.yaml`` of the training run whose checkpoint ``--model`` (or a ``--team`` source) names, when no
    ``--preset`` is given: a model folder ``.../iter_<N>/models/<key>``, a checkpoint ``.../iter_<N>`` or a run
    directory (:func:`drmas_train.run.run_models.run_config_path`); the first found, else None."""
    from drmas_train.run.run_models import run_config_path

    sources = [getattr(args, "model", None)] + [src for pairs in getattr(args, "team", []) for _, src in pairs]
    for source in sources:
        if source and (path := run_config_path(source)) is not None:
            return str(path)
    return None


def run_settings(args: argparse.Namespace) -> list[str]:
    """Before :func:`config_from_args`: make a checkpoint's run (:func:`run_preset_of_models`) the preset when
    ``--preset`` is not given and ``--env`` is not given or names the run's env, and make ``--preset``'s validation
    tasks the tasks when ``--data`` is not given (:func:`validation_tasks_of`). Returns the notes to print: which run's
    settings and tasks are used, or, when ``--env`` names another env than the checkpoint's run trained on, that the
    scores are of another task than the model learned.

    Raises:
        ConfigError: the run's config or its task source does not load.
    """
    from drmas_train.run.config import load_config

    notes = []
    if args.preset is None and (found := run_preset_of_models(args)) is not None:
        cfg = load_config(found)
        if args.envs and args.envs != [cfg.env.id]:
            data = cfg.env.data or "the env's own tasks"
            notes.append(f"the model is a checkpoint of the run {Path(found).parent} trained on {cfg.env.id} "
                         f"(data: {data}); scoring {', '.join(args.envs)} instead, "
                         f"another task (--preset {found} scores the run's own)")  # fmt: skip
        else:
            args.preset = found
            notes.append(f"the model is a checkpoint of a run: its config {found} is the preset (env {cfg.env.id}, "
                         "its validation tasks, sampling and length limits; flags win)")  # fmt: skip
    if args.preset is not None:
        from drmas_train.eval.results import SUMMARY_FILE

        if (Path(args.out) / SUMMARY_FILE).exists():  # refuse before writing validation_tasks.jsonl there
            raise ValueError(f"{args.out} already holds a run ({SUMMARY_FILE} exists); choose a new --out directory")
        env_id = load_config(args.preset).env.id
        if not args.envs or args.envs == [env_id]:
            if (note := validation_tasks_of(args, args.preset)) is not None:
                notes.append(note)
    return notes


def team_models(args: argparse.Namespace) -> dict[str, Any]:
    """``--agent-model`` then ``--team`` (resolved by :func:`drmas_train.run.run_models.team_model`), per role.

    Raises:
        RunModelsError: a run, checkpoint or role of ``--team`` that gives no model.
    """
    models: dict[str, Any] = dict(args.agent_model)
    if args.team:
        from drmas_train.run.run_models import team_model

        for pairs in args.team:
            for role, source in pairs:
                models[role] = team_model(source, role)
    return models


def config_from_args(args: argparse.Namespace, *, agent_models: dict[str, Any] | None = None):
    """An :class:`~drmas_train.eval.evaluate.EvalConfig` from parsed arguments: flags first, then ``--preset``'s
    settings (:func:`preset_defaults`), then EvalConfig's defaults (:func:`eval_defaults`; raises ValueError on bad
    values).

    ``agent_models``: the per-role models (default: ``--agent-model`` and ``--team``, :func:`team_models`); the
    policy is ``llm`` when a model is given and ``--policy`` is not."""
    from drmas_train.eval.evaluate import EvalConfig

    agent_models = team_models(args) if agent_models is None else agent_models
    model = getattr(args, "model", None)
    policy = getattr(args, "policy", None) or ("llm" if model or agent_models else "oracle")
    preset = preset_defaults(args.preset) if args.preset else {}
    fallback = eval_defaults()
    if args.backend == "openai":  # the server applies the chat template and its own prompt limit
        preset.pop("max_prompt_tokens", None)

    def pick(name: str) -> Any:
        value = getattr(args, name)
        return value if value is not None else preset.get(name, fallback[name])

    envs = args.envs or preset.get("envs")
    if not envs:
        raise ValueError("give --env ENV_ID (or --preset PRESET, whose env is evaluated)")
    return EvalConfig(
        envs=envs,
        data=args.data,
        limit=args.limit,
        k=pick("k"),
        policy=policy,
        model=model,
        agent_models=agent_models,
        backend=args.backend,
        base_url=getattr(args, "base_url", None),
        temperature=pick("temperature"),
        top_p=pick("top_p"),
        top_k=pick("top_k"),
        max_new_tokens=pick("max_new_tokens"),
        max_prompt_tokens=pick("max_prompt_tokens"),
        truncation=pick("truncation"),
        seed=args.seed,
        batch_tasks=args.batch_tasks,
        env_kwargs={**preset.get("env_kwargs", {}), **{k: _json_or_str(v) for k, v in args.env_kwarg}},
        label=getattr(args, "label", None),
        transcripts=args.transcripts,
        chat_template_kwargs={**preset.get("chat_template_kwargs", {}),
                              **{k: _json_or_str(v) for k, v in args.chat_template_kwarg}},
    )


def report(summary: dict[str, Any]) -> str:
    """A short console table: env, data source, tasks, avg@k and pass@k (k = the run's k); for games, one line per
    role of the env's overall cell (mean return and win/draw/loss rates, ± one standard error over episodes)."""
    k = summary["k"]
    # columns at least 34 / 18 wide, wider for a longer env id or data source (reasoning_gym/basic_arithmetic)
    env_w = max([34, *(len(env_id) for env_id in summary["metrics"])])
    src_w = max([18, *(len(src) for cells in summary["metrics"].values() for src in cells)])
    lines = [f"{'env':<{env_w}} {'data_source':<{src_w}} {'tasks':>5} {'avg@' + str(k):>9} {'pass@' + str(k):>9}"]
    for env_id, cells in summary["metrics"].items():
        for src, cell in cells.items():
            est = cell["pass@k"].get(str(k))
            pass_k = "—" if est is None else f"{100 * est['value']:.1f}%"
            avg = f"{100 * cell['avg@k']['value']:.1f}%"
            lines.append(f"{env_id:<{env_w}} {src:<{src_w}} {cell['num_tasks']:>5} {avg:>9} {pass_k:>9}")
        for role, st in cells.get("overall", {}).get("roles", {}).items():
            lines.append(f"  {env_id} role {role} (n={st['episodes']}): return {_pm(st['mean_return'], st['return_se'])}, "
                         f"win {_pm(100 * st['win_rate'], _pct(st['win_se']), '%')}, "
                         f"draw {_pm(100 * st['draw_rate'], _pct(st['draw_se']), '%')}, "
                         f"loss {_pm(100 * st['loss_rate'], _pct(st['loss_se']), '%')}")  # fmt: skip
    return "\n".join(lines)


def _pct(se: float | None) -> float | None:
    return None if se is None else 100 * se


def _pm(value: float, se: float | None, unit: str = "") -> str:
    """``"-0.22 ± 0.24"``, or ``"55.4% ± 5.0%"`` with ``unit="%"`` (no ``±`` part without a standard error)."""
    digits = 1 if unit == "%" else 2
    return f"{value:.{digits}f}{unit}" + ("" if se is None else f" ± {se:.{digits}f}{unit}")


def _undo_out(out: Path, existed: bool, tasks_existed: bool) -> None:
    """After a refusal: remove the ``validation_tasks.jsonl`` this command wrote into ``out`` (``--preset``), and
    ``out`` itself when this command created it and it holds nothing else."""
    tasks = out / "validation_tasks.jsonl"
    if not tasks_existed and tasks.is_file():
        tasks.unlink()
    if not existed and out.is_dir() and not any(out.iterdir()):
        out.rmdir()


def main(argv: list[str]) -> int:
    """Entry point of ``drmas eval``; returns the exit code (2 on bad arguments)."""
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    before = (out.exists(), (out / "validation_tasks.jsonl").exists())  # a refusal leaves --out as it found it
    try:
        check_counts(args)
        notes = run_settings(args)
        config = config_from_args(args)
    except ValueError as err:  # RunModelsError (--team), ConfigError too
        print(f"drmas eval: {err}", file=sys.stderr)
        _undo_out(out, *before)
        return 2
    for note in notes:
        print(f"drmas eval: {note}", file=sys.stderr)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from drmas_envs.registration import RegistrationError
    from drmas_train.eval.baselines import BaselineError
    from drmas_train.eval.evaluate import EvalInputError, evaluate
    from drmas_train.eval.results import ResultsError

    expected: tuple[type[BaseException], ...] = (
        ResultsError, RegistrationError, BaselineError, FileNotFoundError, EvalInputError)
    if config.policy == "llm":
        from drmas_train.model.assignment import AssignmentError
        from drmas_train.model.models import ModelNotFoundError

        expected += (AssignmentError, ModelNotFoundError)
    try:
        run = evaluate(config, args.out, progress=not args.no_progress)
    except expected as err:  # user errors: say what is wrong, no traceback
        print(f"drmas eval: {err}", file=sys.stderr)
        _undo_out(out, *before)
        return 2
    print(report(run.summary))
    print(f"wrote {args.out} ({run.summary['num_episodes']} episodes, {run.summary['wall_time_s']:.1f} s)")
    return 0
