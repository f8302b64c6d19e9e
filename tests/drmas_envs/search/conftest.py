"""Search tests cache indexes in a throw-away directory (never the user's ~/.cache/drmas)."""

import os
import tempfile

os.environ["DRMAS_CACHE_DIR"] = tempfile.mkdtemp(prefix="drmas-search-tests-")
