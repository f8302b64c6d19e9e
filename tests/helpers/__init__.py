"""Helpers shared by the test folders: tiny models and envs, scripted backends, rank bodies, data locations.

Imported as ``helpers.<module>`` (pyproject's ``pythonpath = [".", "tests"]``); processes that tests start find them
through ``PYTHONPATH``, which tests/conftest.py extends with tests/. Modules here hold no tests and no fixtures
(fixtures live in a ``conftest.py``).
"""
