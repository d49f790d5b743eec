"""Renderers: stored results in, text out (the report room). Pure functions; the CLI decides where bytes go."""
