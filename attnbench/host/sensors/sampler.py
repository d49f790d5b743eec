"""A daemon thread that polls named readings at a fixed interval, outside the timed loop.

Generic over "read one value" callables, so NVML and psutil readings share one loop and the loop is tested with
plain functions. A reading that fails with an error its source knows (``Channel.classify``) is dropped from then
on and recorded in ``failures``; a fatal one (the driver vanished) drops every reading of the same group. An
error no source knows is a bug: it stops the thread and ``stop`` re-raises it in the caller's thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

Reading = float | int | None
Sample = dict[str, float | int | None]


@dataclass(frozen=True)
class Failure:
    """A known way for a reading to fail. ``fatal``: the whole source is gone, not just this reading."""

    reason: str
    fatal: bool = False


@dataclass(frozen=True)
class Channel:
    """One call per poll: ``read()`` returns a value, or None for "nothing this time" (the sample leaves it out),
    or, for a call that answers several readings at once (``readings``), a mapping of them."""

    name: str
    read: Callable[[], Reading | Mapping[str, Reading]]
    classify: Callable[[Exception], Failure | None]  # a known failure, or None: a bug, re-raised by ``stop``
    group: str = ""
    readings: tuple[str, ...] = ()  # what a mapping-valued read provides; () = the one reading ``name``

    @property
    def provides(self) -> tuple[str, ...]:
        return self.readings or (self.name,)


class Sampler:
    """Polls ``channels`` every ``interval_s`` between ``start`` and ``stop``; one sample at each end as well.

    Sample times ``t_s`` are seconds from ``start`` on ``clock``. Use once.
    """

    def __init__(
        self, channels: Sequence[Channel], interval_s: float, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self.failures: dict[str, str] = {}
        self.fatal: dict[str, str] = {}  # group -> reason
        self._channels = list(channels)
        self._clock = clock
        self._t0 = 0.0
        self._t1: float | None = None
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._bug: Exception | None = None

    @property
    def window_s(self) -> float:
        end = self._clock() if self._t1 is None else self._t1
        return max(0.0, end - self._t0)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._t0 = self._clock()
        self._poll()
        self._thread = threading.Thread(target=self._loop, name="attnbench-telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop and join the thread, take the closing sample, end the window; re-raise a bug from the thread."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join()
        if self._bug is None:
            self._poll()
        self._t1 = self._clock()
        if self._bug is not None:
            raise self._bug

    def _loop(self) -> None:
        # Deadlines from the start, not "interval after the last poll", so slow reads do not stretch the period.
        ticks = 1
        while not self._halt.wait(max(0.0, self._t0 + ticks * self.interval_s - self._clock())):
            self._poll()
            if self._bug is not None:
                return
            ticks = max(ticks + 1, int((self._clock() - self._t0) / self.interval_s) + 1)

    def _poll(self) -> None:
        row: Sample = {"t_s": self._clock() - self._t0}
        for channel in list(self._channels):
            if channel not in self._channels:  # dropped by a fatal failure earlier in this poll
                continue
            try:
                value = channel.read()
            except Exception as exc:  # handed to the channel's source to name; unknown ones are bugs, kept
                failure = channel.classify(exc)
                if failure is None:
                    self._bug = exc
                    return
                self._fail(channel, failure)
                continue
            if isinstance(value, Mapping):
                row.update({name: v for name, v in value.items() if v is not None})
            elif value is not None:
                row[channel.name] = value
        self.samples.append(row)

    def _fail(self, channel: Channel, failure: Failure) -> None:
        if not failure.fatal:
            self._channels.remove(channel)
            self.failures.update(dict.fromkeys(channel.provides, failure.reason))
            return
        # A lost driver takes every reading of the source with it, including the ones that worked until now:
        # their samples cover only part of the window.
        self.fatal[channel.group] = failure.reason
        for other in [c for c in self._channels if c.group == channel.group]:
            self._channels.remove(other)
            self.failures.update(dict.fromkeys(other.provides, failure.reason))
