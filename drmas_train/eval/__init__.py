"""Floor 6, eval (above floors 0-5): scripted and LLM policies played without training, avg@k / pass@k
metrics, results, leaderboard.
"""
