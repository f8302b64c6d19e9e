"""Fidelity tests: scripted episodes asserting the Dr. MAS reference's behaviour (``langfengQ/DrMAS``).

Each test names the reference file and lines it checks. The reference itself is not needed to run them; where a
local mirror of it exists (``$DRMAS_REFERENCE_GIT``, default ``/work/.mirror/langfengQ+DrMAS/repo``), the prompt
templates are also compared with it verbatim.
"""

import os
import tempfile

os.environ.setdefault("DRMAS_CACHE_DIR", tempfile.mkdtemp(prefix="drmas-fidelity-tests-"))
