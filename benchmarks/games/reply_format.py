"""How often an untrained model's reply is a legal ``<action>NAME</action>`` in a game, for candidate prompts.

The game quickstart (``quickstart_kuhn``) can only learn if the initial model sometimes replies in the env's format
(an invalid reply is replaced by a random legal move, so its return says nothing about the reply). This script
deals ``--hands`` seeded Kuhn poker hands against ``random-v0`` (seats rotated), asks the model once per hand at its
first decision for each candidate system prompt and temperature, and prints JSON: per candidate, the share of
valid replies and of each move. No training; one model load.

    python benchmarks/games/reply_format.py --hands 32 --threads 1 --temperatures 0.7 \
        --out benchmarks/games/data/reply_format.json

``--presets`` asks the same of game presets instead (each preset's env id, kwargs and ``rollout.stop``; its first
decision in ``--hands`` seeded games against its opponent, seats rotated): per preset, the share of valid replies
and of each legal move (``moves``), e.g. the game pilot's candidates:

    python benchmarks/games/reply_format.py --presets quickstart_game_tic_tac_toe,quickstart_game_connect_four \
        --hands 32 --threads 1 --temperatures 0.7 --out benchmarks/games/data/reply_format_pilot.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import drmas_envs
from drmas_envs.games.actions import match_action, parse_action
from drmas_envs.games.openspiel_env import SYSTEM_PROMPT, USER_PROMPT

#: the few-shot user message of the quickstart_kuhn preset: the reply format shown twice, with either move on a
#: Queen (not a strategy), ending in an "Answer:" cue as quickstart_math's prompts do
FEW_SHOT = (
    "You are playing Kuhn poker as player {player}. {rules}\n\n"
    "Reply with your move in the form <action>NAME</action>.\n\n"
    "Example:\nYour view: 1\nLegal actions: Pass, Bet\nAnswer: <action>Pass</action>\n\n"
    "Example:\nYour view: 1p\nLegal actions: Pass, Bet\nAnswer: <action>Bet</action>\n\n"
    "Your view: {view}\nLegal actions: {legal}\nAnswer:"
)
#: candidates: name -> (system prompt, user prompt template)
CANDIDATES = {
    "default": (SYSTEM_PROMPT, USER_PROMPT),
    "system_examples": (
        "You are playing a card game. Answer with your move in the form <action>NAME</action>, NAME one of the legal "
        "actions.\n\nExample:\nLegal actions: Pass, Bet\nAnswer: <action>Pass</action>\n\nExample:\n"
        "Legal actions: Pass, Bet\nAnswer: <action>Bet</action>", USER_PROMPT),
    "few_shot_user": (SYSTEM_PROMPT, FEW_SHOT),
    "few_shot_user_no_system": ("", FEW_SHOT),
    "quickstart_kuhn": (SYSTEM_PROMPT, None),  # the preset's own user message (read from the preset)
    "quickstart_kuhn_no_system": ("", None),
}


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, ask the model, print (and with ``--out`` write) the JSON; returns 0."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--hands", type=int, default=32)
    p.add_argument("--temperatures", default="0.7,1.0")
    p.add_argument("--only", default=None, help="comma-separated candidate names (default: all)")
    p.add_argument("--presets", default=None,
                   help="comma-separated game presets: measure their own prompts instead of the Kuhn candidates")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="also write the JSON here")
    args = p.parse_args(argv)

    import torch

    from drmas_train.backends.base import SamplingParams
    from drmas_train.backends.factory import make_backend
    from drmas_train.model.models import load_model
    from drmas_train.run.config import load_config

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    backend = make_backend(load_model(args.model), "hf", seed=0)
    load_s = time.perf_counter() - t0
    out: dict = {"model": args.model, "hands": args.hands, "max_new_tokens": args.max_new_tokens,
                 "load_s": round(load_s, 1), "candidates": {}}  # fmt: skip
    if args.presets:
        for preset in args.presets.split(","):
            out["candidates"].update(_preset_rows(backend, preset, args))
        return _emit(out, args.out)
    names = args.only.split(",") if args.only else list(CANDIDATES)
    for name in names:
        system, user = CANDIDATES[name]
        user = user or load_config("quickstart_kuhn").env.kwargs["user_prompt"]
        env = drmas_envs.make("openspiel/kuhn_poker-v0", opponent="random-v0", opponent_seat="rotate",
                              system_prompt=system, user_prompt=user)  # fmt: skip
        prompts, legal = first_decisions(env, args.hands)
        for temp in (float(t) for t in args.temperatures.split(",")):
            t1 = time.perf_counter()
            gens = backend.generate(prompts, SamplingParams(temperature=temp, max_new_tokens=args.max_new_tokens, seed=0))
            moves = [match_action(parse_action(g.text), names) for g, names in zip(gens, legal, strict=True)]
            valid = [m for m in moves if m is not None]
            out["candidates"][f"{name}@{temp}"] = {
                "valid": len(valid) / len(moves),
                "pass": sum(m == 0 for m in valid) / len(moves),
                "bet": sum(m == 1 for m in valid) / len(moves),
                "generate_s": round(time.perf_counter() - t1, 1),
                "example": gens[0].text,
            }
    return _emit(out, args.out)


def first_decisions(env: Any, hands: int) -> tuple[list[list[dict]], list[list[str]]]:
    """The chat messages and legal move names of the first decision in ``hands`` seeded games of ``env`` (reset seed
    g, rollout index g: seats rotated as in a group)."""
    prompts, legal = [], []
    for g in range(hands):
        env.reset(seed=g, options={"rollout_index": g})
        obs = env.observe(env.agent_selection)
        prompts.append(list(obs["messages"]))
        legal.append(env.unwrapped._legal_names(env.unwrapped.possible_agents.index(env.agent_selection)))
    return prompts, legal


def _emit(out: dict, path: str | None) -> int:
    text = json.dumps(out, indent=2)
    print(text)
    if path:
        Path(path).write_text(text + "\n")
    return 0


def _preset_rows(backend: Any, preset: str, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """``{"<preset>@<temperature>": row}`` for a game preset: the first decision of ``args.hands`` seeded games
    (reset seed g, rollout index g: seats rotated as in a group) under the preset's env id and kwargs, generated with
    its ``rollout.stop``; ``valid`` is the share of replies naming a legal move, ``moves`` each move's share of all
    replies (by its name in the first game that offered it).

    Raises:
        ConfigError: ``preset`` is not a config, or its env is not a game (no legal move names).
    """
    from drmas_train.backends.base import SamplingParams
    from drmas_train.run.config import ConfigError, load_config

    cfg = load_config(preset)
    env = drmas_envs.make(cfg.env.id, **dict(cfg.env.kwargs))
    if not hasattr(env.unwrapped, "_legal_names"):
        raise ConfigError(f"--presets {preset}: env {cfg.env.id!r} is not a game of drmas_envs.games")
    prompts, legal = first_decisions(env, args.hands)
    rows = {}
    for temp in (float(t) for t in args.temperatures.split(",")):
        t1 = time.perf_counter()
        sampling = SamplingParams(temperature=temp, max_new_tokens=args.max_new_tokens, seed=0,
                                  stop=tuple(cfg.rollout.stop))  # fmt: skip
        gens = backend.generate(prompts, sampling)
        moves = [match_action(parse_action(g.text), names) for g, names in zip(gens, legal, strict=True)]
        counts: dict[str, int] = {}
        for move, names in zip(moves, legal, strict=True):
            if move is not None:
                counts[names[move]] = counts.get(names[move], 0) + 1
        rows[f"{preset}@{temp}"] = {
            "env_id": cfg.env.id,
            "valid": sum(counts.values()) / len(moves),
            "moves": {name: n / len(moves) for name, n in sorted(counts.items())},
            "generate_s": round(time.perf_counter() - t1, 1),
            "example": gens[0].text,
        }
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
