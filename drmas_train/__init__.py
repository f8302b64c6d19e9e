"""drmas_train: batched multi-agent LLM rollouts, GRPO and Dr. MAS advantages, PPO updates per model."""

__version__ = "0.1.0"
