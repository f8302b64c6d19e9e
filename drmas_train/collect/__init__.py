"""Stage 2, collect: the rollout engine plays env episodes with the models and turns them into ``Sample``s."""
