"""Stage 3, algorithm: advantages (GRPO / Dr. MAS), policy losses, π_old log-probs and the PPO update."""
