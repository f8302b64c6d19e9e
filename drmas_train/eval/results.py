"""The versioned result schema of ``drmas eval``: one JSONL row per episode, one summary JSON per run.

A results directory holds exactly::

    RESULTS_DIR/
      summary.json      one object: run metadata, config + config hash, metrics table (see docs/results-schema.md)
      episodes.jsonl    one object per line: one episode (one sample of one task)

Both carry ``"schema_version"``; :func:`load_run` refuses any version other than :data:`SCHEMA_VERSION`
with :class:`SchemaVersionError`, naming the directory, the version found and what to do.
The full field list is in ``docs/results-schema.md``; :data:`EPISODE_FIELDS` and :data:`SUMMARY_FIELDS`
are the required keys.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drmas_envs.core.episode import EpisodeRecord

__all__ = [
    "SCHEMA_VERSION",
    "EPISODE_FIELDS",
    "SUMMARY_FIELDS",
    "SchemaVersionError",
    "ResultsError",
    "RunResult",
    "config_hash",
    "git_commit",
    "write_run",
    "load_run",
    "episode_row",
    "episode_fields",
    "QA_INFO_KEYS",
]

#: Bump when a field changes meaning or a required field is added/removed; document the change in
#: docs/results-schema.md ("Version history").
SCHEMA_VERSION = 1

SUMMARY_FILE = "summary.json"
EPISODES_FILE = "episodes.jsonl"

#: Required keys of every episode row (optional ones: em, f1, num_searches, transcript, extra).
EPISODE_FIELDS: tuple[str, ...] = (
    "schema_version",
    "run_id",
    "env_id",
    "env_version",
    "data_source",
    "task_id",
    "sample_index",
    "seed",
    "policy",
    "agent_models",
    "num_turns",
    "reward",
    "won",
    "returns",
    "calls",
    "invalid_actions",
    "tokens_in",
    "tokens_out",
    "wall_time_s",
)

#: Required keys of summary.json.
SUMMARY_FIELDS: tuple[str, ...] = (
    "schema_version",
    "run_id",
    "created_at",
    "drmas_version",
    "git_commit",
    "config",
    "config_hash",
    "policy",
    "agent_models",
    "envs",
    "k",
    "sampling",
    "num_episodes",
    "wall_time_s",
    "metrics",
)


class ResultsError(ValueError):
    """A results directory is missing, incomplete or malformed (message names the file and the problem)."""


class SchemaVersionError(ResultsError):
    """A results directory was written with a different schema version than this drmas reads."""


@dataclasses.dataclass
class RunResult:
    """One loaded run: its directory, ``summary.json`` as a dict and its episode rows."""

    path: Path
    summary: dict[str, Any]
    episodes: list[dict[str, Any]]

    @property
    def label(self) -> str:
        """Display name: ``summary["label"]`` if set, else the policy and models."""
        return str(self.summary.get("label") or self.summary["policy"])


def config_hash(config: Mapping[str, Any]) -> str:
    """SHA-256 (hex, first 16 chars) of ``config`` as canonical JSON (sorted keys, no spaces).

    Raises:
        TypeError: when ``config`` is not JSON-serialisable.
    """
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def git_commit(path: str | Path | None = None) -> str | None:
    """The commit hash of the git checkout containing ``path`` (default: this package), or None outside git.

    A ``-dirty`` suffix marks uncommitted changes to tracked files.
    """
    cwd = Path(path) if path is not None else Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "") if head else None


def env_version(env_id: str) -> int:
    """The version number of an env id ``name-vN`` (e.g. ``"math-solver-verifier-v0"`` -> 0).

    Raises:
        ValueError: when ``env_id`` does not end in ``-v<digits>``.
    """
    name, sep, version = env_id.rpartition("-v")
    if not sep or not name or not version.isdigit():
        raise ValueError(f"env id {env_id!r} does not end in '-v<N>' (e.g. 'math-solver-verifier-v0')")
    return int(version)


def episode_row(**fields: Any) -> dict[str, Any]:
    """Build one episode row: fills ``schema_version`` and ``env_version`` and checks the required keys.

    Raises:
        ValueError: naming missing required fields.
    """
    row = {"schema_version": SCHEMA_VERSION, **fields}
    if "env_id" in row and "env_version" not in row:
        row["env_version"] = env_version(row["env_id"])
    missing = [f for f in EPISODE_FIELDS if f not in row]
    if missing:
        raise ValueError(f"episode row is missing required field(s) {missing}; see docs/results-schema.md")
    return row


#: Where per-episode EM / F1 / number of searches are read from the episode's metrics (first key present).
QA_INFO_KEYS: dict[str, tuple[str, ...]] = {
    "em": ("em", "exact_match"),
    "f1": ("f1", "token_f1"),
    "num_searches": ("num_searches", "searches"),
}


def episode_fields(
    episode: EpisodeRecord,
    *,
    wall_time_s: float,
    tokens_in: Mapping[str, int] | None = None,
    tokens_out: Mapping[str, int] | None = None,
    finish_reasons: Iterable[str] | None = None,
    transcripts: bool = False,
) -> dict[str, Any]:
    """The per-episode fields of a result row, a view of the env's record (docs/results-schema.md).

    Args:
        episode: the played episode (:class:`~drmas_envs.core.episode.EpisodeRecord`).
        wall_time_s: seconds the episode took.
        tokens_in, tokens_out: prompt / response tokens per agent (0 for agents not listed: no tokenizer).
        finish_reasons: ``"stop"``/``"length"`` per call (LLM runs); when given, ``truncated`` and
            ``finish_reasons`` are added.
        transcripts: add ``transcript`` (``[{"agent", "text", "valid"}, ...]``; with ``finish_reasons`` each entry
            also has ``truncated``: the reply was cut at the response length limit, ``finish_reason == "length"``).

    Returns:
        ``data_source``, ``task_id``, ``num_turns``, ``reward``, ``won``, ``returns``, ``calls``,
        ``invalid_actions``, ``tokens_in``, ``tokens_out``, ``wall_time_s``, the QA fields found in the
        episode's metrics (:data:`QA_INFO_KEYS`), for games (``episode.agent_rewards`` set) ``agent_rewards``,
        ``learners`` and ``opponent``, and the optional fields above. Add the run's fields and pass
        the result to :func:`episode_row`.
    """
    tokens_in, tokens_out = tokens_in or {}, tokens_out or {}
    fields: dict[str, Any] = {
        "data_source": episode.data_source,
        "task_id": episode.task_id,
        "num_turns": episode.num_turns,
        "reward": float(episode.reward),
        "won": bool(episode.won),
        "returns": dict(episode.returns),
        "calls": episode.calls_per_agent(),
        "invalid_actions": episode.invalid_per_agent(),
        "tokens_in": {a: tokens_in.get(a, 0) for a in episode.agents},
        "tokens_out": {a: tokens_out.get(a, 0) for a in episode.agents},
        "wall_time_s": wall_time_s,
    }
    if finish_reasons is not None:
        fields.update(truncated=bool(episode.truncated), finish_reasons=list(finish_reasons))
    if episode.agent_rewards:  # games: each seat's own return, who learned, against whom
        fields["agent_rewards"] = {a: float(r) for a, r in episode.agent_rewards.items()}
        fields["learners"] = list(episode.metrics.get("learners") or episode.agents)
        fields["opponent"] = episode.metrics.get("opponent")
    for field, keys in QA_INFO_KEYS.items():
        value = next((episode.metrics[k] for k in keys if _is_number(episode.metrics.get(k))), None)
        if value is not None:
            fields[field] = float(value)
    if transcripts:
        fields["transcript"] = [{"agent": c.agent_id, "text": c.text, "valid": c.valid} for c in episode.calls]
        if finish_reasons is not None:  # a reply cut at max_new_tokens says so in the transcript
            for entry, reason in zip(fields["transcript"], fields["finish_reasons"], strict=True):
                entry["truncated"] = reason == "length"
    return fields


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable in a result row")


def write_run(path: str | Path, summary: Mapping[str, Any], episodes: Iterable[Mapping[str, Any]]) -> Path:
    """Write ``summary.json`` and ``episodes.jsonl`` into directory ``path`` (created if needed).

    ``schema_version`` and ``created_at`` are filled when absent.

    Raises:
        ValueError: ``summary`` lacks a required field, or ``path`` already holds a run (never overwritten).
    """
    out = Path(path)
    if (out / SUMMARY_FILE).exists():
        raise ResultsError(f"{out} already holds a run ({SUMMARY_FILE} exists); choose a new --out directory")
    summary = {"schema_version": SCHEMA_VERSION, "created_at": _now(), **summary}
    missing = [f for f in SUMMARY_FIELDS if f not in summary]
    if missing:
        raise ValueError(f"summary is missing required field(s) {missing}; see docs/results-schema.md")
    out.mkdir(parents=True, exist_ok=True)
    with open(out / EPISODES_FILE, "w", encoding="utf-8") as fh:
        for row in episodes:
            fh.write(json.dumps(row, ensure_ascii=False, default=_json_default, allow_nan=False) + "\n")
    text = json.dumps(summary, indent=2, ensure_ascii=False, default=_json_default, allow_nan=False)
    (out / SUMMARY_FILE).write_text(text + "\n", encoding="utf-8")
    return out


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _check_version(found: Any, where: str) -> None:
    if found == SCHEMA_VERSION:
        return
    if isinstance(found, int) and found < SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{where} was written with result schema version {found}, but this drmas reads version "
            f"{SCHEMA_VERSION} only; re-run 'drmas eval' to regenerate it (the changes between versions are "
            f"listed in docs/results-schema.md)"
        )
    if isinstance(found, int):
        raise SchemaVersionError(
            f"{where} was written with result schema version {found}, newer than the version {SCHEMA_VERSION} "
            f"this drmas reads; upgrade drmas to load it"
        )
    raise SchemaVersionError(f"{where} has no valid 'schema_version' (got {found!r}); is it a drmas results dir?")


def load_run(path: str | Path, *, episodes: bool = True) -> RunResult:
    """Load a results directory written by :func:`write_run`.

    Args:
        path: the directory.
        episodes: also read ``episodes.jsonl`` (the leaderboard only needs the summary).

    Raises:
        ResultsError: missing directory/files, invalid JSON (names file and line) or missing fields.
        SchemaVersionError: a schema version other than :data:`SCHEMA_VERSION` in the summary or any row.
    """
    root = Path(path)
    summary_path = root / SUMMARY_FILE
    if not root.is_dir():
        raise ResultsError(f"results directory {root} does not exist")
    if not summary_path.is_file():
        raise ResultsError(f"{root} is not a drmas results directory: {SUMMARY_FILE} not found")
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ResultsError(f"{summary_path} is not valid JSON: {err}") from err
    if not isinstance(summary, dict):
        raise ResultsError(f"{summary_path} must hold a JSON object, got {type(summary).__name__}")
    _check_version(summary.get("schema_version"), str(summary_path))
    missing = [f for f in SUMMARY_FIELDS if f not in summary]
    if missing:
        raise ResultsError(f"{summary_path} is missing required field(s) {missing}")
    rows: list[dict[str, Any]] = []
    if episodes:
        ep_path = root / EPISODES_FILE
        if not ep_path.is_file():
            raise ResultsError(f"{root} is incomplete: {EPISODES_FILE} not found")
        with open(ep_path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ResultsError(f"{ep_path}:{lineno} is not valid JSON: {err}") from err
                _check_version(row.get("schema_version"), f"{ep_path}:{lineno}")
                missing = [f for f in EPISODE_FIELDS if f not in row]
                if missing:
                    raise ResultsError(f"{ep_path}:{lineno} is missing required field(s) {missing}")
                rows.append(row)
    return RunResult(root, summary, rows)
