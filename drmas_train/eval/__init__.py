"""Stage 4, eval: scripted and LLM policies played without training, avg@k / pass@k metrics, results, leaderboard."""
