"""Search tests cache indexes in a throw-away directory (never the user's ~/.cache/drmas).

Re-exports the root conftest's ``shared_file`` (a test module's ``from conftest import shared_file`` resolves to
this file inside tests/search/).
"""

import importlib.util
import os
import tempfile
from pathlib import Path

os.environ["DRMAS_CACHE_DIR"] = tempfile.mkdtemp(prefix="drmas-search-tests-")

_spec = importlib.util.spec_from_file_location("_drmas_root_conftest", Path(__file__).resolve().parents[1] / "conftest.py")
_root = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_root)
shared_file = _root.shared_file
SHARED_DATA = _root.SHARED_DATA
