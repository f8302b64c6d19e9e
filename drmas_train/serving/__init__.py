"""Serving models to other programs: the OpenAI-compatible server (``drmas serve``) over any drmas backend.

It sits above :mod:`drmas_train.backends` (it calls their ``generate``); the retrieval server, its search-side
sibling, lives in :mod:`drmas_envs.search.server` (``drmas retrieval-server``).
"""
