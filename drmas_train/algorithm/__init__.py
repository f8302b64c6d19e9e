"""Floor 5, algorithm (above floors 0-4, errors to collect): advantages (GRPO / Dr. MAS), policy losses, π_old
log-probs and the PPO update.
"""
