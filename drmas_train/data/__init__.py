"""Data preparation (``drmas data``): the Dr. MAS reference's data sets rebuilt from the raw files a user downloads.

Floor 1 of drmas_train (over errors; reads drmas_envs).

:mod:`~drmas_train.data.recipe` (a recipe, its inputs and errors), :mod:`~drmas_train.data.recipes` (the math,
search and wiki-18 recipes), :mod:`~drmas_train.data.prepare` (run a recipe, write and verify ``MANIFEST.json``).
It needs no torch and nothing of training; the trainer only checks that the files its config names exist.
"""
