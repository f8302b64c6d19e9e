"""How often an untrained model's reply is a legal ``<action>NAME</action>`` in a game, for candidate prompts.

The game quickstart (``quickstart_kuhn``) can only learn if the initial model sometimes replies in the env's format
(an invalid reply is replaced by a random legal move, so its return says nothing about the reply). This script
deals ``--hands`` seeded Kuhn poker hands against ``random-v0`` (seats rotated), asks the model once per hand at its
first decision for each candidate system prompt and temperature, and prints JSON: per candidate, the share of
valid replies and of each move. No training; one model load.

    python benchmarks/games/reply_format.py --hands 32 --threads 1 --temperatures 0.7 \
        --out benchmarks/games/data/reply_format.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

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
    names = args.only.split(",") if args.only else list(CANDIDATES)
    for name in names:
        system, user = CANDIDATES[name]
        user = user or load_config("quickstart_kuhn").env.kwargs["user_prompt"]
        env = drmas_envs.make("openspiel/kuhn_poker-v0", opponent="random-v0", opponent_seat="rotate",
                              system_prompt=system, user_prompt=user)  # fmt: skip
        prompts, legal = [], []
        for g in range(args.hands):
            env.reset(seed=g, options={"rollout_index": g})
            obs = env.observe(env.agent_selection)
            prompts.append(list(obs["messages"]))
            legal.append(env.unwrapped._legal_names(env.unwrapped.possible_agents.index(env.agent_selection)))
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
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
