"""Readings of stored runs, torch-free: regression verdicts (compare and its thresholds), scaling laws and
crossovers, efficiency against peaks, internal consistency, selfcheck verdicts. Imports ``core`` and
``results``."""
