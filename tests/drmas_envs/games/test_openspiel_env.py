"""The OpenSpiel adapter: scripted episodes whose returns equal OpenSpiel's, conformance, seeding, dead steps,
invalid-reply fallbacks, seats and argument errors, for every openspiel/ id."""

from __future__ import annotations

import importlib
import re
import sys
import warnings

import pytest

pyspiel = pytest.importorskip("pyspiel")

import drmas_envs  # noqa: E402
from drmas_envs.core import play_episode  # noqa: E402
from drmas_envs.testing import check_env, check_episode_record  # noqa: E402

GAME_IDS = [
    "openspiel/kuhn_poker-v0",
    "openspiel/leduc_poker-v0",
    "openspiel/liars_dice-v0",
    "openspiel/tic_tac_toe-v0",
    "openspiel/connect_four-v0",
]


def legal_names(obs):
    """The legal action names the prompt lists."""
    line = next(line for line in obs["prompt"].splitlines() if line.startswith("Legal actions: "))
    return line.removeprefix("Legal actions: ").split(", ")


def scripted(moves):
    """A policy playing ``moves`` (names) in order, one per call, as ``<action>`` replies."""
    it = iter(moves)
    return lambda obs: f"Let me see. <action>{next(it)}</action>"


def replay(game_name, history_ids, player_moves):
    """OpenSpiel's own play: chance outcomes from ``history_ids``, player moves by name from ``player_moves``."""
    state = pyspiel.load_game(game_name).new_initial_state()
    moves = iter(player_moves)
    for action in history_ids:
        if state.is_chance_node():
            state.apply_action(action)
        else:
            legal = {state.action_to_string(state.current_player(), a): a for a in state.legal_actions()}
            state.apply_action(legal[next(moves)])
    assert state.is_terminal() and next(moves, None) is None
    return state.returns(), state.history()


# (env id, player_0's moves, player_1's moves, golden |return| of player_0 or None when the deal decides)
SCRIPTS = [
    ("openspiel/kuhn_poker-v0", ["Bet"], ["Bet"], 2.0),  # bet, call: showdown for 2 chips
    ("openspiel/leduc_poker-v0", ["Call", "Call"], ["Call", "Call"], None),  # check down: +-1 or a split
    ("openspiel/liars_dice-v0", ["1-1"], ["Liar"], 1.0),
    ("openspiel/tic_tac_toe-v0", ["x(0,0)", "x(0,1)", "x(0,2)"], ["o(1,0)", "o(1,1)"], 1.0),
    ("openspiel/connect_four-v0", ["x0", "x0", "x0", "x0"], ["o1", "o1", "o1"], 1.0),
]


@pytest.mark.parametrize(("env_id", "moves_0", "moves_1", "golden"), SCRIPTS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scripted_episode_returns_equal_openspiels(env_id, moves_0, moves_1, golden, seed):
    env = drmas_envs.make(env_id)
    record = play_episode(env, {"player_0": scripted(moves_0), "player_1": scripted(moves_1)}, seed=seed)
    game = env.unwrapped.GAME
    returns, history = replay(game, record.metrics["history"], [m for pair in _interleave(moves_0, moves_1) for m in pair])
    assert record.metrics["history"] == history
    assert dict(record.agent_rewards) == {"player_0": returns[0], "player_1": returns[1]}
    assert dict(record.returns) == dict(record.agent_rewards)  # every reply valid: no penalty
    assert all(c.valid and c.info["fallback"] is None for c in record.calls)
    assert [c.score for c in record.calls] == [record.agent_rewards[c.agent_id] for c in record.calls]
    assert (record.reward, record.won) == (returns[0], returns[0] > returns[1])  # self-play: player_0's view
    if golden is not None:
        assert abs(returns[0]) == golden and returns[0] == -returns[1]
    if game in ("tic_tac_toe", "connect_four"):
        assert returns == [1.0, -1.0]  # player 0 completes its line first


def _interleave(a, b):
    """Moves in turn order for the scripts above (strict alternation, player 0 first; leduc's rounds too)."""
    out = []
    for i in range(max(len(a), len(b))):
        out.append([m for m in (a[i : i + 1] + b[i : i + 1])])
    return out


@pytest.mark.parametrize("env_id", GAME_IDS)
def test_conformance_and_episode_record(env_id):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # api_test's advice on agent names
        assert set(check_env(env_id, cross_process=False)) >= {"api_test", "seed_test", "determinism"}
    check_episode_record(env_id)


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        ("openspiel/kuhn_poker-v0", {"opponent": "cfr-v0"}),
        ("openspiel/kuhn_poker-v0", {"opponent": "random-v0", "opponent_seat": 0, "invalid_action": "forfeit"}),
        ("openspiel/tic_tac_toe-v0", {"opponent": "mcts-v0"}),
        ("openspiel/liars_dice-v0", {"opponent": "random-v0", "opponent_seat": 1}),
    ],
)
def test_conformance_with_a_fixed_opponent(env_id, kwargs, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env_id, cross_process=False, **kwargs)
    check_episode_record(env_id, **kwargs)


@pytest.mark.parametrize("env_id", GAME_IDS)
def test_dead_steps(env_id):
    env = drmas_envs.make(env_id)
    env.reset(seed=3)
    while not any(env.terminations.values()):
        env.step("no move")  # invalid: a random legal move is played
    dead = env.agent_selection
    assert env.terminations[dead] and env.agents == ["player_0", "player_1"]
    with pytest.raises(ValueError, match=re.escape(f"agent {dead!r} is done (terminated or truncated); its only valid")):
        env.step("<action>x</action>")
    env.step(None)
    env.step(None)
    assert env.agents == []


def test_same_seed_same_episode_and_the_seat_follows_the_seed():
    def play(seed):
        env = drmas_envs.make("openspiel/kuhn_poker-v0", opponent="random-v0")
        return play_episode(env, {"player_0": lambda o: "?", "player_1": lambda o: "?"}, seed=seed)

    assert play(5) == play(5)
    seats = [play(seed).metrics["learners"] for seed in range(12)]
    assert {tuple(s) for s in seats} == {("player_0",), ("player_1",)}  # both seats are trained across seeds
    fixed = drmas_envs.make("openspiel/kuhn_poker-v0", opponent="random-v0", opponent_seat=0)
    for seed in range(4):
        record = play_episode(fixed, {"player_1": lambda o: "?"}, seed=seed)
        assert record.metrics["learners"] == ["player_1"] and {c.agent_id for c in record.calls} == {"player_1"}
        assert record.reward == record.agent_rewards["player_1"]  # reward/won: the learner's


def test_invalid_reply_random_fallback_costs_the_penalty():
    env = drmas_envs.make("openspiel/tic_tac_toe-v0", format_penalty=0.25)
    record = play_episode(env, {"player_0": lambda o: "x(1,1)", "player_1": scripted(["o(0,0)"] * 5)}, seed=0)
    p0 = [c for c in record.calls if c.agent_id == "player_0"]
    assert all(not c.valid and c.info["fallback"] == "random" and c.info["parsed_action"] is None for c in p0)
    assert all(c.info["action"].startswith("x(") for c in p0)  # a legal move was played instead
    # o(0,0) is legal only while free: player_1's later calls fall back too
    invalid = record.invalid_per_agent()
    assert record.returns["player_0"] == record.agent_rewards["player_0"] - 0.25 * invalid["player_0"]
    assert record.returns["player_1"] == record.agent_rewards["player_1"] - 0.25 * invalid["player_1"]


@pytest.mark.parametrize(
    ("env_id", "first_move", "loser_returns"),
    [("openspiel/kuhn_poker-v0", "Bet", (-2.0, 2.0)), ("openspiel/leduc_poker-v0", "Call", (-13.0, 13.0))],
)
def test_invalid_reply_forfeit_ends_the_game_at_min_and_max_utility(env_id, first_move, loser_returns):
    env = drmas_envs.make(env_id, invalid_action="forfeit")
    record = play_episode(env, {"player_0": scripted([first_move]), "player_1": lambda o: "I fold?"}, seed=0)
    last = record.calls[-1]
    assert (last.agent_id, last.valid, last.info["fallback"], last.info["action"]) == ("player_1", False, "forfeit", None)
    assert dict(record.agent_rewards) == {"player_0": loser_returns[1], "player_1": loser_returns[0]}
    assert record.returns["player_1"] == loser_returns[0] - 0.1
    assert record.metrics["forfeit"] == "player_1" and record.won  # player_0 (the reference seat) won


def test_opponent_moves_are_recorded_and_only_the_learner_calls():
    env = drmas_envs.make("openspiel/connect_four-v0", opponent="random-v0", opponent_seat=1)
    record = play_episode(env, {"player_0": scripted(["x3"] * 21)}, seed=0)
    assert {c.agent_id for c in record.calls} == {"player_0"} and record.metrics["opponent"] == "random-v0"
    movers = [agent for agent, _ in record.metrics["moves"]]
    assert movers[:2] == ["player_0", "player_1"] and "player_1" in movers
    assert record.returns["player_1"] == record.agent_rewards["player_1"]  # the opponent pays no penalty


def test_prompt_shows_the_view_and_the_legal_actions():
    env = drmas_envs.make("openspiel/tic_tac_toe-v0")
    env.reset(seed=0)
    obs = env.observe("player_0")
    assert obs["messages"][0] == {"role": "system", "content": "You are a helpful and harmless assistant."}
    user = obs["messages"][1]["content"]
    assert "You are playing tic-tac-toe as player 0 (2 players; player 0 moves first)." in user
    assert "Your view of the game (OpenSpiel's observation string):\n...\n...\n...\n" in user
    assert legal_names(obs) == [f"x({r},{c})" for r in range(3) for c in range(3)]
    assert user.endswith("give your move as <action>NAME</action>, where NAME is one of the legal actions.")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"opponent": "mcts-v0"}, "opponent must be None (self-play) or one of ['random-v0', 'cfr-v0'] for kuhn_poker, got 'mcts-v0'"),
        ({"opponent": "random-v0", "opponent_seat": 2}, "opponent_seat must be 'random', 'rotate' or a player index in [0, 2), got 2"),
        ({"opponent_seat": True}, "opponent_seat must be 'random', 'rotate' or a player index in [0, 2), got True"),
        ({"opponent": "random-v0", "opponent_seat": "alternate"},
         "opponent_seat must be 'random', 'rotate' or a player index in [0, 2), got 'alternate'"),
        ({"invalid_action": "skip"}, "invalid_action must be one of ('random', 'forfeit'), got 'skip'"),
        ({"system_prompt": 3}, "system_prompt must be a str or None, got int"),
        ({"user_prompt": 3}, "user_prompt must be a str, got int"),
        ({"user_prompt": "Your card: {card}"},
         "user_prompt: KeyError 'card': a template may use only the fields {title}, {player}, {num_players}, "
         "{rules}, {view_kind}, {view}, {legal} (literal braces doubled)"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        drmas_envs.make("openspiel/kuhn_poker-v0", **kwargs)


def test_a_user_prompt_template_replaces_the_user_message():
    env = drmas_envs.make("openspiel/kuhn_poker-v0", opponent="random-v0", opponent_seat=1, system_prompt="",
                          user_prompt="{title}, player {player}: view {view}; moves {legal} {{literal}}")  # fmt: skip
    env.reset(seed=0)
    obs = env.observe("player_0")
    view = env.unwrapped._state.information_state_string(0)
    assert obs["messages"] == ({"role": "user", "content": f"Kuhn poker, player 0: view {view}; moves Pass, Bet {{literal}}"},)


def test_rotate_seats_the_learner_by_rollout_index_and_falls_back_to_the_seed():
    env = drmas_envs.make("openspiel/kuhn_poker-v0", opponent="random-v0", opponent_seat="rotate")
    policies = {"player_0": lambda o: "?", "player_1": lambda o: "?"}
    for seed in range(3):  # whatever the seed, rollout g of a group plays seat g mod 2
        learners = [play_episode(env, policies, seed=seed, options={"rollout_index": g}).metrics["learners"]
                    for g in range(5)]  # fmt: skip
        assert learners == [["player_0"], ["player_1"], ["player_0"], ["player_1"], ["player_0"]]
    random_seat = drmas_envs.make("openspiel/kuhn_poker-v0", opponent="random-v0")  # no index: as "random"
    for seed in range(6):
        assert play_episode(env, policies, seed=seed) == play_episode(random_seat, policies, seed=seed)
    with pytest.raises(ValueError, match=re.escape("options['rollout_index'] must be an int >= 0 (the episode's "
                                                   "index in its group), got -1")):  # fmt: skip
        env.reset(seed=0, options={"rollout_index": -1})


def test_importing_games_without_open_spiel_names_the_extra(monkeypatch):
    for name in [m for m in sys.modules if m == "drmas_envs.games" or m.startswith("drmas_envs.games.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pyspiel", None)  # import pyspiel now raises ImportError
    with pytest.raises(ImportError, match=re.escape("drmas_envs.games needs OpenSpiel, drmas's optional extra 'games': pip install 'drmas[games]'")):
        importlib.import_module("drmas_envs.games")


@pytest.mark.slow  # a fresh interpreter imports drmas_envs and open_spiel (~2 s)
def test_playing_a_game_imports_no_torch():
    import subprocess

    code = (
        "import sys, drmas_envs\n"
        "from drmas_envs.core import play_episode\n"
        "env = drmas_envs.make('openspiel/leduc_poker-v0', opponent='cfr-v0')\n"
        "play_episode(env, {'player_0': lambda o: '?', 'player_1': lambda o: '?'}, seed=0)\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False"]


def test_a_waiting_or_finished_agent_sees_only_its_own_view():
    env = drmas_envs.make("openspiel/kuhn_poker-v0")
    env.reset(seed=0)
    state = env.unwrapped._state
    waiting = env.observe("player_1")["prompt"]
    assert f"OpenSpiel's information state string):\n{state.information_state_string(1)}\n" in waiting
    assert "Legal actions: (none: not your turn)" in waiting
    env.step("<action>Pass</action>")
    env.step("<action>Pass</action>")
    assert not env.agents or all(env.terminations.values())
    done = env.observe("player_0")["prompt"]
    assert f"string):\n{state.information_state_string(0)}\n" in done and str(state) not in done  # no hidden card
