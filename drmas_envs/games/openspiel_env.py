"""The adapter: one OpenSpiel game as a drmas text AEC env (turns, observations, replies, returns, opponents).

Subclasses (one module per registered id) set the class attributes :attr:`OpenSpielEnv.GAME`, ``TITLE``,
``RULES``, ``VIEW`` and ``OPPONENTS``; the game logic stays in OpenSpiel. Each episode:

1. ``reset``: a new initial state; with an ``opponent``, the learner's seat is drawn (``opponent_seat="random"``)
   from the env's ``np_random``, so the seed decides it, or rotates over the rollouts of a group
   (``opponent_seat="rotate"``: in a two-player game the learner plays seat ``g mod 2`` in the group's g-th rollout,
   reset option ``rollout_index``), so every role is trained, in equal shares;
2. chance nodes are resolved with ``np_random`` from the outcomes' probabilities, the opponent moves for its seats,
   until a learning agent is to act (:meth:`OpenSpielEnv._advance`);
3. each agent call is read with :mod:`drmas_envs.games.actions`; an invalid reply costs its agent
   ``format_penalty`` and is replaced by a random legal move (``invalid_action="random"``) or ends the game as a
   loss for that player (``"forfeit"``);
4. at the end each seat ``player_k`` receives its own game return (``state.returns()[k]``, or the forfeit returns).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import pyspiel

from drmas_envs.core import ListTaskSource, Outcome, Task, TextAECEnv, Turn
from drmas_envs.games.actions import match_action, parse_action
from drmas_envs.games.opponents import opponent_action

__all__ = ["OpenSpielEnv", "INVALID_ACTIONS", "PROMPT_FIELDS", "SEAT_CHOICES", "SYSTEM_PROMPT", "USER_PROMPT",
           "agent_name"]

#: The ``str.format`` fields a ``user_prompt`` may use: the game's title, the acting player's index, the number of
#: players, the game's rules, which view string it is, the view, and the legal action names joined by ", ".
PROMPT_FIELDS = ("title", "player", "num_players", "rules", "view_kind", "view", "legal")

#: What replaces an invalid reply; the first is the default.
INVALID_ACTIONS = ("random", "forfeit")

#: ``opponent_seat`` values besides a fixed player index; the first is the default.
SEAT_CHOICES = ("random", "rotate")

#: The system message of every call (the Dr. MAS reference's default system message).
SYSTEM_PROMPT = "You are a helpful and harmless assistant."

#: The user message (the default ``user_prompt``): ``str.format`` fields :data:`PROMPT_FIELDS`.
USER_PROMPT = (
    "You are playing {title} as player {player} ({num_players} players; player 0 moves first).\n"
    "{rules}\n\n"
    "Your view of the game (OpenSpiel's {view_kind} string):\n{view}\n\n"
    "Legal actions: {legal}\n\n"
    "Think briefly, then give your move as <action>NAME</action>, where NAME is one of the legal actions."
)


def agent_name(player: int) -> str:
    """Agent id of OpenSpiel player ``player``: ``"player_<k>"``."""
    return f"player_{player}"


class OpenSpielEnv(TextAECEnv):
    """An OpenSpiel game played by text agents ``player_0 .. player_{n-1}`` (one per seat).

    Args:
        opponent: ``None`` (self-play: every seat is an agent) or the name of a fixed opponent of
            :mod:`drmas_envs.games.opponents` that this game accepts (``OPPONENTS``): it plays every seat but
            the learner's, inside ``step``.
        opponent_seat: with an opponent, how the learner's seat is chosen at each ``reset``: ``"random"``
            (default: the opponent's seat is drawn from ``np_random``, so the seed decides it and the learner plays
            every seat across seeds), ``"rotate"`` (the opponent plays seat ``(g + 1) mod n`` in the g-th rollout
            of a group, the reset option ``rollout_index`` that the rollout engine passes; in a two-player game the
            learner plays seat ``g mod 2``, so a group of G >= 2 rollouts trains both seats, in shares that differ
            by at most one; without that option, drawn as ``"random"``), or a fixed player index: the seat the
            opponent plays.
        invalid_action: ``"random"`` (default): an invalid reply is replaced by a uniformly random legal action
            (``np_random``); ``"forfeit"``: the game ends, the invalid player's return is the game's
            ``min_utility()`` and every other player's ``max_utility()``.
        format_penalty: reward subtracted per invalid call (Dr. MAS default 0.1).
        system_prompt: the system message (``None`` or ``""``: the user message alone).
        user_prompt: the user message's template (default :data:`USER_PROMPT`), ``str.format`` fields
            :data:`PROMPT_FIELDS` (literal braces doubled), e.g. few-shot examples of the reply format for a small
            model (the ``quickstart_kuhn`` preset).
        render_mode: ``None``, ``"ansi"`` or ``"human"``.

    Raises:
        ValueError: an opponent this game does not accept, a bad ``opponent_seat`` or ``invalid_action``, a
            non-str ``system_prompt``, a ``user_prompt`` that is not a str or names another field, plus :class:`~drmas_envs.core.TextAECEnv`'s errors.
    """

    #: OpenSpiel's short name of the game (``pyspiel.load_game``).
    GAME: str = ""
    #: Display name in the prompt.
    TITLE: str = ""
    #: The rules and how to read the view string, in the prompt and as the task's question.
    RULES: str = ""
    #: Which string the acting player sees: ``"information_state"`` (imperfect information: the player's
    #: perfect-recall history) or ``"observation"`` (the board of a perfect-information game).
    VIEW: str = "information_state"
    #: Fixed opponents this game accepts.
    OPPONENTS: tuple[str, ...] = ("random-v0",)

    # per_agent_rewards: each seat receives its own return (Outcome.rewards); trainers read it to log and validate
    # per role (drmas_train.run.trainer)
    metadata: dict[str, Any] = {**TextAECEnv.metadata, "name": "drmas_openspiel", "per_agent_rewards": True}

    # ---- per-episode state, rebuilt by _start_episode ----
    _state: pyspiel.State  # the OpenSpiel state
    _learners: tuple[int, ...]  # seats the agents of the AEC loop play (every seat without an opponent)
    _forfeit: int | None  # the player who forfeited (invalid_action="forfeit"), if any
    _moves: list[tuple[str, str]]  # (agent, action name) of every player move, opponent's included

    def __init__(
        self,
        *,
        opponent: str | None = None,
        opponent_seat: int | str = "random",
        invalid_action: str = "random",
        format_penalty: float = 0.1,
        system_prompt: str | None = SYSTEM_PROMPT,
        user_prompt: str = USER_PROMPT,
        render_mode: str | None = None,
    ) -> None:
        self.game = pyspiel.load_game(self.GAME)
        game_type = self.game.get_type()
        if game_type.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
            raise ValueError(f"{self.GAME}: only sequential games are supported, got {game_type.dynamics}")
        n = self.game.num_players()
        if opponent is not None and opponent not in self.OPPONENTS:
            raise ValueError(
                f"opponent must be None (self-play) or one of {list(self.OPPONENTS)} for {self.GAME}, got {opponent!r}"
            )
        if opponent_seat not in SEAT_CHOICES and (
            isinstance(opponent_seat, bool) or not isinstance(opponent_seat, numbers.Integral)
            or not 0 <= opponent_seat < n
        ):  # fmt: skip
            raise ValueError(f"opponent_seat must be 'random', 'rotate' or a player index in [0, {n}), "
                             f"got {opponent_seat!r}")  # fmt: skip
        if invalid_action not in INVALID_ACTIONS:
            raise ValueError(f"invalid_action must be one of {INVALID_ACTIONS}, got {invalid_action!r}")
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ValueError(f"system_prompt must be a str or None, got {type(system_prompt).__name__}")
        if not isinstance(user_prompt, str):
            raise ValueError(f"user_prompt must be a str, got {type(user_prompt).__name__}")
        try:
            user_prompt.format(**dict.fromkeys(PROMPT_FIELDS, ""))
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(f"user_prompt: {type(err).__name__} {err}: a template may use only the fields "
                             f"{', '.join('{' + f + '}' for f in PROMPT_FIELDS)} (literal braces doubled)") from None
        self.user_prompt = user_prompt
        self.opponent = opponent
        self.opponent_seat = opponent_seat
        self.invalid_action = invalid_action
        self.system_prompt = system_prompt or ""
        self.possible_agents = [agent_name(p) for p in range(n)]
        task = Task(f"{self.GAME}-0", f"openspiel/{self.GAME}", self.RULES, "")
        super().__init__(ListTaskSource([task], name=self.GAME), format_penalty=format_penalty, render_mode=render_mode)

    # ---- hooks ----
    def _start_episode(self) -> str:
        self._state = self.game.new_initial_state()
        self._forfeit = None
        self._moves = []
        n = self.game.num_players()
        if self.opponent is None:
            self._learners = tuple(range(n))
        else:  # the opponent's seat; the learners play the others
            if self.opponent_seat == "rotate" and self.rollout_index is not None:
                seat = (self.rollout_index + 1) % n  # two players: the learner plays seat g mod 2
            elif self.opponent_seat in SEAT_CHOICES:  # "random", or "rotate" without a rollout index
                seat = int(self.np_random.integers(n))
            else:
                seat = int(self.opponent_seat)
            self._learners = tuple(p for p in range(n) if p != seat)
        first = self._advance()
        if first is None:
            raise RuntimeError(f"{self.GAME}: the game ended before a learning agent could act")
        return first

    def _prompt(self, agent: str) -> tuple[str, str]:
        player = self.possible_agents.index(agent)
        state = self._state
        # PettingZoo may observe any agent at any time: it always gets its own view (never the hidden cards of
        # str(state)); legal actions only when it is to act
        acting = not state.is_terminal() and self._forfeit is None and state.current_player() == player
        view = self._view(player)
        legal = self._legal_names(player) if acting else []
        user = self.user_prompt.format(
            title=self.TITLE, player=player, num_players=self.game.num_players(), rules=self.RULES,
            view_kind=self.VIEW.replace("_", " "), view=view, legal=", ".join(legal) or "(none: not your turn)",
        )  # fmt: skip
        return self.system_prompt, user

    def _act(self, agent: str, text: str) -> Turn:
        player = self.possible_agents.index(agent)
        legal = self._state.legal_actions(player)
        parsed = parse_action(text)
        index = match_action(parsed, self._legal_names(player))
        valid = index is not None
        info: dict[str, Any] = {"parsed_action": parsed, "fallback": None}
        if index is None and self.invalid_action == "forfeit":
            self._forfeit = player
            return Turn(False, None, info={**info, "action": None, "fallback": "forfeit"})
        if index is None:
            index = int(self.np_random.integers(len(legal)))
            info["fallback"] = "random"
        action = int(legal[index])
        name = self._state.action_to_string(player, action)
        self._state.apply_action(action)
        self._moves.append((agent, name))
        info["action"] = name
        return Turn(valid, self._advance(), info=info)

    def _episode_outcome(self) -> Outcome:
        n = self.game.num_players()
        if self._forfeit is not None:
            returns = [float(self.game.max_utility())] * n
            returns[self._forfeit] = float(self.game.min_utility())
        else:
            returns = [float(r) for r in self._state.returns()]
        reference = self._learners[0]
        others = [r for p, r in enumerate(returns) if p != reference]
        info = {
            "returns": returns,
            "learners": [agent_name(p) for p in self._learners],
            "opponent": self.opponent,
            "forfeit": None if self._forfeit is None else agent_name(self._forfeit),
            "moves": [list(m) for m in self._moves],
            "history": [int(a) for a in self._state.history()],
        }
        return Outcome(
            reward=returns[reference],
            won=bool(returns[reference] > max(others)),
            info=info,
            rewards={agent_name(p): r for p, r in enumerate(returns)},
        )

    # ---- helpers ----
    def _advance(self) -> str | None:
        """Resolve chance nodes and opponent moves until a learning agent is to act; its id, or None at the end."""
        state = self._state
        while not state.is_terminal():
            if state.is_chance_node():
                outcomes, probs = zip(*state.chance_outcomes(), strict=True)
                p = np.asarray(probs, dtype=np.float64)
                state.apply_action(int(outcomes[int(self.np_random.choice(len(outcomes), p=p / p.sum()))]))
                continue
            player = state.current_player()
            if player in self._learners:
                return agent_name(player)
            action = opponent_action(self.opponent, state, self.np_random)  # type: ignore[arg-type]
            self._moves.append((agent_name(player), state.action_to_string(player, action)))
            state.apply_action(action)
        return None

    def _view(self, player: int) -> str:
        if self.VIEW == "observation":
            return self._state.observation_string(player)
        return self._state.information_state_string(player)

    def _legal_names(self, player: int) -> list[str]:
        return [self._state.action_to_string(player, a) for a in self._state.legal_actions(player)]
