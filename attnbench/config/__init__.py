"""YAML in, a frozen ``Experiment`` out: reading the source, validating it (pydantic lives only here), plain-words
errors with file, line and key path. Imports ``core`` only."""
