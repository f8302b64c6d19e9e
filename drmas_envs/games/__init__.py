"""OpenSpiel games as drmas text AEC envs: agents whose rewards differ by construction (issue 42).

Floor 3 of drmas_envs (over ``core`` and ``data``; never ``math`` or ``search``).

Optional extra ``games`` (``pip install 'drmas[games]'``, which installs ``open_spiel``). The game logic stays in
OpenSpiel; :mod:`drmas_envs.games.openspiel_env` only maps turns, observations, replies and returns onto the text
AEC base. One module per registered id (its docstring is the env card); ``docs/games.md`` is the overview.

| id | module | fixed opponents |
|---|---|---|
| ``openspiel/kuhn_poker-v0`` | :mod:`drmas_envs.games.kuhn_poker` | ``random-v0``, ``cfr-v0`` |
| ``openspiel/leduc_poker-v0`` | :mod:`drmas_envs.games.leduc_poker` | ``random-v0``, ``cfr-v0`` |
| ``openspiel/liars_dice-v0`` | :mod:`drmas_envs.games.liars_dice` | ``random-v0`` |
| ``openspiel/tic_tac_toe-v0`` | :mod:`drmas_envs.games.tic_tac_toe` | ``random-v0``, ``mcts-v0`` |
| ``openspiel/connect_four-v0`` | :mod:`drmas_envs.games.connect_four` | ``random-v0``, ``mcts-v0`` |

Per-role evaluation of the played episodes: :mod:`drmas_envs.core.role_stats` (needs no OpenSpiel).

Raises:
    ImportError: on import when OpenSpiel is not installed (the message names the extra).
"""

try:
    import pyspiel  # noqa: F401  (the C++ core of open_spiel)
except ImportError as err:  # tests: test_importing_games_without_open_spiel_names_the_extra
    raise ImportError(
        "drmas_envs.games needs OpenSpiel, drmas's optional extra 'games': pip install 'drmas[games]' "
        "(or pip install 'open_spiel>=2.0.2,<2.1')"
    ) from err
