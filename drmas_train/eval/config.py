"""The ``eval`` section of the training config: periodic validation during training (avg@k / pass@k on held-out
tasks). ``drmas eval``'s own configuration is :class:`drmas_train.eval.evaluate.EvalConfig`."""

from __future__ import annotations

from dataclasses import dataclass

from drmas_train.errors import require

__all__ = ["ValidationConfig"]


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
    opponents: list[str] | None = None
    """games only (:mod:`drmas_envs.games`): validate against each of these fixed opponents (the env's
    ``opponent`` argument, e.g. ``[random-v0, cfr-v0]``), ``k`` episodes each, and log per role the mean return
    and win/draw/loss rates with standard errors (``val/<opponent>/<role>/...``, docs/games.md); null = the
    training env as configured (its own opponent, or self-play, logged as ``val/self-play/...``)."""

    def validate(self) -> None:
        """Raises: ConfigError: naming the key (``eval.<field>``), the bad value and what is accepted."""
        require(self.every >= 0, f"eval.every must be >= 0 (0 = never), got {self.every}")
        require(self.k >= 1 and self.size >= 1, "eval.k and eval.size must be >= 1")
        require(self.temperature >= 0, f"eval.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        require(0 < self.top_p <= 1, f"eval.top_p must be in (0, 1], got {self.top_p}")
        require(self.opponents is None or (len(self.opponents) > 0 and all(isinstance(o, str) and o
                                                                          for o in self.opponents)),
                f"eval.opponents must be null or a non-empty list of opponent names (e.g. [random-v0]), "
                f"got {self.opponents!r}")  # fmt: skip
