"""The one exception the telemetry package raises internally (stdlib only)."""

from __future__ import annotations


class TelemetryUnavailable(Exception):
    """A telemetry source cannot be used here; the message is the reason recorded for each of its metrics.

    Never escapes ``open_telemetry``: it becomes ``unavailable`` entries in the summary.
    """
