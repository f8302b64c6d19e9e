"""Floor 4, collect (above floors 0-3): the rollout engine plays env episodes with the models and turns them
into ``Sample``s.
"""
