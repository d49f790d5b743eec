from __future__ import annotations

import os
import tempfile

# Rich decides width and colour from the terminal; pin both so CLI output can be asserted.
os.environ["COLUMNS"] = "160"
os.environ["NO_COLOR"] = "1"
os.environ.setdefault("TERM", "dumb")
# Live sweeps in tests must never pick up (or write) the developer's real calibration cache.
os.environ["ATTNBENCH_CACHE"] = tempfile.mkdtemp(prefix="attnbench-test-cache-")
