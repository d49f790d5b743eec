"""Renderers: stored results in, text out (DESIGN layer 4). Pure functions; the CLI decides where bytes go."""
