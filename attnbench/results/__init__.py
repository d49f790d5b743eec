"""The run-folder contract, torch-free: the stored values (rows, run metadata, measurements, telemetry
summaries, environment, calibration), their field checks, and writing and reading a run folder safely.
Imports ``core`` only; everything downstream (analysis, reports, the CLI) reads runs through here."""
