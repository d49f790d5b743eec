"""Commands registered on attnbench.cli.app (filled in by the issue that adds them)."""
