from __future__ import annotations

import os

# Rich decides width and colour from the terminal; pin both so CLI output can be asserted.
os.environ["COLUMNS"] = "160"
os.environ["NO_COLOR"] = "1"
os.environ.setdefault("TERM", "dumb")
