"""The commands' work as library calls, below ``cli``: what a command does between reading its options and printing,
so that two commands (``merge`` and ``submit``) or the Python API share it. Prints nothing, exits nothing."""
