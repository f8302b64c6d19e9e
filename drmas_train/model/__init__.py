"""Floor 2, model (above errors, data): model specs and loading, the agent -> model assignment, log-probs and
the chunked LM head.

The generation backends that serve these models live beside it in :mod:`drmas_train.backends`.
"""
