"""Text AEC base, spaces, the Task record and the episode record shared by every drmas env.

Floor 1 of drmas_envs (over ``_rng`` only; docs/architecture.md, "drmas_envs's floors").
"""
from drmas_envs.core.episode import CallRecord, EpisodeRecord, episode_record, play_episode
from drmas_envs.core.spaces import AnyText, observation_space
from drmas_envs.core.task import ListTaskSource, Task, TaskSource
from drmas_envs.core.text_env import Outcome, TextAECEnv, Turn, TurnRecord

__all__ = [
    "AnyText",
    "observation_space",
    "Task",
    "TaskSource",
    "ListTaskSource",
    "TextAECEnv",
    "Turn",
    "Outcome",
    "TurnRecord",
    "CallRecord",
    "EpisodeRecord",
    "episode_record",
    "play_episode",
]
