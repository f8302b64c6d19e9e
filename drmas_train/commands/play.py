"""``drmas play``: play one episode of an env and print its transcript to stdout.

Every agent is played by the same kind of policy unless ``--agent-policy AGENT=POLICY`` says otherwise:

* ``oracle`` / ``random`` / ``no-search``: the scripted baselines of :mod:`drmas_train.eval.baselines`;
* ``human``: you type the action (the agent's prompt is shown; finish with an empty line; end of input = "");
* ``llm``: an LLM (:meth:`drmas_train.eval.policies.LLMPolicy.from_model`, ``--model``, ``--backend hf|vllm|openai``).

Examples::

    drmas play --env math-solver-verifier-v0 --policy oracle
    drmas play --env math-solver-verifier-v0 --policy llm --model smollm2-135m-instruct --max-new-tokens 128
    drmas play --env search-orchestrator-v0 --policy oracle --agent-policy answer=human --show-prompts

Exit codes: 0 the episode ended; 2 a user mistake (unknown env id, policy, agent, or a missing ``--model``).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
from collections.abc import Callable
from typing import Any, TextIO

from drmas_train.commands import HelpFormatter

__all__ = ["main", "build_parser", "play_episode", "Reply"]

POLICIES = ("oracle", "random", "no-search", "human", "llm")



@dataclasses.dataclass(frozen=True)
class Reply:
    """An LLM's action with how it ended.

    Attributes:
        text: the action text the env receives.
        truncated: the reply was cut at the response length limit (the backend's ``finish_reason == "length"``,
            ``--max-new-tokens``) rather than ended by the model.
    """

    text: str
    truncated: bool = False


#: ``act(env, agent, observation) -> action text`` (a :class:`Reply` where it may be cut at a length limit).
Actor = Callable[[Any, str, Any], "str | Reply"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``drmas play``."""
    from drmas_train.commands.eval import eval_defaults

    d = eval_defaults()  # the sampling and length defaults drmas eval uses, written once (EvalConfig)
    p = argparse.ArgumentParser(prog="drmas play", description="Play one episode of an env; print its transcript.",
                                formatter_class=HelpFormatter)  # fmt: skip
    p.add_argument("--env", required=True, metavar="ENV_ID", help="env id name-vN (drmas envs lists them)")
    p.add_argument("--policy", default="oracle", choices=POLICIES, help="policy of every agent")
    p.add_argument("--agent-policy", action="append", default=[], metavar="AGENT=POLICY",
                   help="policy of one agent (repeat)")  # fmt: skip
    p.add_argument("--model", default=None, help="model of the llm policy: a name, path or HF id (openai: served name)")
    p.add_argument("--backend", default=d["backend"], choices=["hf", "vllm", "openai"], help="backend of the llm policy")
    p.add_argument("--base-url", default=None, help="server URL for --backend openai, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--temperature", type=float, default=d["temperature"],
                   help="sampling temperature of the llm policy (0 = greedy)")
    p.add_argument("--max-new-tokens", type=int, default=d["max_new_tokens"],
                   help="response length limit per agent call, in tokens; a reply cut there is marked "
                        "[truncated at the token limit]")  # fmt: skip
    p.add_argument("--data", default=None, help="task source (math envs): file path, reasoning_gym:<name>, hf:<id>")
    p.add_argument("--task-index", type=int, default=None, help="task to play (default: drawn from --seed)")
    p.add_argument("--seed", type=int, default=0, help="seeds the task draw, scripted policies and sampling")
    p.add_argument("--show-prompts", action="store_true", help="print each agent's prompt before its action")
    return p


def _human(stdin: TextIO, stdout: TextIO) -> Actor:
    def act(env: Any, agent: str, observation: Any) -> str:
        stdout.write(f"[{agent}] your action (end with an empty line):\n")
        stdout.flush()
        lines = []
        for line in stdin:
            if not line.strip():
                break
            lines.append(line.rstrip("\n"))
        return "\n".join(lines)

    return act


def _scripted(name: str, seed: int) -> Actor:
    from drmas_train.eval.baselines import get_baseline

    policy, rng = get_baseline(name), random.Random(seed)
    return lambda env, agent, observation: policy(env, agent, rng)


def _llm(args: argparse.Namespace) -> Actor:
    from drmas_train.eval.policies import LLMPolicy

    policy = LLMPolicy.from_model(args.model, backend=args.backend, base_url=args.base_url, progress=True,
                                  temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed)  # fmt: skip

    def act(env: Any, agent: str, observation: Any) -> Reply:
        text = policy(observation, desc=f"{agent}: generating")
        return Reply(text, truncated=policy.last_generations[0].finish_reason == "length")

    return act


def play_episode(env: Any, actors: dict[str, Actor], *, seed: int, task_index: int | None = None,
                 out: TextIO | None = None, show_prompts: bool = False) -> dict[str, Any]:  # fmt: skip
    """Play one episode of the drmas AEC ``env`` (``actors``: agent -> actor) and write its transcript to ``out``
    (default: ``sys.stdout``).

    A reply cut at the response length limit (a :class:`Reply` with ``truncated``) is marked on its turn's header,
    ``[truncated at the token limit]``, and counted on the last line.

    Returns:
        the final info of the episode (``score``, ``won`` and the env's own fields) plus ``returns`` (agent -> float)
        and ``truncated_replies`` (the number of replies cut at the length limit).
    """
    out = sys.stdout if out is None else out
    options = {"task_index": task_index} if task_index is not None else None
    env.reset(seed=seed, options=options)
    raw = getattr(env, "unwrapped", env)
    task = getattr(raw, "task", None)
    if task is not None:
        out.write(f"# task {task.task_id} [{task.data_source}]\n{task.question}\n\n")
    final: dict[str, Any] = {}
    turn = cut = 0
    for agent in env.agent_iter():
        observation, _, terminated, truncated, info = env.last()
        if terminated or truncated:
            final = final or dict(info)
            env.step(None)
            continue
        if show_prompts:
            out.write(f"--- prompt of {agent} ---\n{observation.get('prompt', observation)}\n")
        reply = actors[agent](raw, agent, observation)
        action, truncated_reply = (reply.text, reply.truncated) if isinstance(reply, Reply) else (reply, False)
        env.step(action)
        step_info = env.infos.get(agent, {})
        valid = "" if step_info.get("is_action_valid", True) else "  [invalid action]"
        mark = "  [truncated at the token limit]" if truncated_reply else ""
        out.write(f"--- turn {turn} · {agent}{valid}{mark} ---\n{action}\n")
        turn, cut = turn + 1, cut + truncated_reply
    returns = {a: float(v) for a, v in getattr(raw, "episode_returns", {}).items()}
    final["returns"], final["truncated_replies"] = returns, cut
    score = final.get("score", float("nan"))
    cuts = f", {cut} of {turn} replies truncated at the token limit" if cut else ""
    out.write(f"=== episode over: score {score:g}, won {bool(final.get('won', False))}, returns {returns}{cuts} ===\n")
    return final


def main(argv: list[str]) -> int:
    """Entry point; returns the exit code."""
    import drmas_envs
    from drmas_envs.registration import RegistrationError

    args = build_parser().parse_args(argv)
    per_agent: dict[str, str] = {}
    for item in args.agent_policy:
        agent, sep, name = item.partition("=")
        if not sep or name not in POLICIES:
            print(f"drmas play: --agent-policy {item!r} must be AGENT=POLICY with POLICY one of {list(POLICIES)}",
                  file=sys.stderr)  # fmt: skip
            return 2
        per_agent[agent] = name
    kwargs: dict[str, Any] = {}
    try:
        if args.data:
            from drmas_envs.data.load import load_tasks

            kwargs["data"] = load_tasks(args.data, seed=args.seed)
        env = drmas_envs.make(args.env, **kwargs)
    except (RegistrationError, FileNotFoundError, ValueError, TypeError) as err:
        print(f"drmas play: {err}", file=sys.stderr)
        return 2
    unknown = sorted(set(per_agent) - set(env.possible_agents))
    if unknown:
        print(f"drmas play: --agent-policy names {unknown}, not agents of {args.env}; its agents: "
              f"{list(env.possible_agents)}", file=sys.stderr)  # fmt: skip
        return 2
    names = {a: per_agent.get(a, args.policy) for a in env.possible_agents}
    if "llm" in names.values() and not args.model:
        print("drmas play: policy llm needs --model (e.g. --model smollm2-135m-instruct)", file=sys.stderr)
        return 2
    llm = _llm(args) if "llm" in names.values() else None
    human = _human(sys.stdin, sys.stdout) if "human" in names.values() else None
    actors = {a: llm if n == "llm" else human if n == "human" else _scripted(n, args.seed) for a, n in names.items()}
    from drmas_train.eval.baselines import BaselineError

    try:
        play_episode(env, actors, seed=args.seed, task_index=args.task_index,
                     show_prompts=args.show_prompts or human is not None)  # fmt: skip
    except BaselineError as err:
        print(f"drmas play: {err}", file=sys.stderr)
        return 2
    return 0
