"""drmas_train: batched multi-agent LLM rollouts, GRPO and Dr. MAS advantages, PPO updates per model.

The package is grouped by the stages of the data flow, one sub-package per stage, each importing only the stages
below it (docs/architecture.md, "Package layout"; tests/architecture/test_layout.py checks every import).
"""

__version__ = "0.1.0"
