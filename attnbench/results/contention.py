"""``Contention``: whether the machine was busy with other work while one case was timed, and the evidence.

Torch-free: ``measure.contention`` reads the counters and judges; this is the stored value, which ``report``
headlines and ``compare`` refuses to conclude from. Every figure is optional: a counter the platform does not have
(no ``/proc``, no NVML) is None, and ``reasons`` says in words why a case counts as contended.

Schema history: added to results.jsonl rows as the optional key ``contention`` (absent in older rows, which read
back as "not measured"); ``run.json`` gained ``contended_cases`` at the same time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnbench.core.units import plural
from attnbench.results import fields

_OPTIONAL = (
    *("threads", "logical_cores", "cpu_share", "others_cores", "load_start", "load_end", "steal_pct"),
    *("run_wait_pct", "gpu_processes", "sm_clock_mhz", "app_clock_mhz", "clock_events"),
)


@dataclass(frozen=True)
class Contention:
    """What the machine did besides our case over its timed window (warm-up and samples)."""

    contended: bool
    reasons: tuple[str, ...]  # one sentence per rule that fired; empty when not contended
    window_s: float
    threads: int | None = None  # the intra-op threads the case asked for
    logical_cores: int | None = None  # the cores this process may run on
    cpu_share: float | None = None  # this process's CPU seconds per wall second (cores used)
    others_cores: float | None = None  # cores kept busy by everything else, on average over the window
    load_start: float | None = None  # the 1-minute load average at the window's ends (it lags: evidence only)
    load_end: float | None = None
    steal_pct: float | None = None  # CPU time the hypervisor gave to other guests, % of the window's CPU time
    run_wait_pct: float | None = None  # time this process's threads waited for a CPU, % of the window (summed)
    gpu_processes: int | None = None  # other processes holding a compute context on the GPU (NVML)
    sm_clock_mhz: float | None = None  # the SM clock at the window's end
    app_clock_mhz: float | None = None  # the application (target) SM clock
    # NVML's clock-event reasons at the window's end, by name (gpu_idle, sw_power_cap, hw_thermal_slowdown, …)
    clock_events: tuple[str, ...] | None = None

    @property
    def evidence(self) -> str:
        """The figures in one line, for a table cell or a CSV column."""
        parts: list[str] = []
        if self.others_cores is not None and self.logical_cores is not None:
            parts.append(f"others used {self.others_cores:.1f} of {self.logical_cores} cores")
        if self.cpu_share is not None and self.threads is not None:
            parts.append(f"this case {self.cpu_share:.1f} cores for {plural(self.threads, 'thread')}")
        if self.run_wait_pct is not None:
            parts.append(f"run-queue wait {self.run_wait_pct:.0f} %")
        if self.steal_pct is not None:
            parts.append(f"steal {self.steal_pct:.1f} %")
        if self.load_end is not None:
            parts.append(f"load {self.load_end:.2f}")
        if self.gpu_processes is not None:
            parts.append(f"{self.gpu_processes} other GPU processes")
        if self.sm_clock_mhz is not None and self.app_clock_mhz is not None:
            why = f" ({', '.join(self.clock_events)})" if self.clock_events else ""
            parts.append(f"SM clock {self.sm_clock_mhz:.0f}/{self.app_clock_mhz:.0f} MHz{why}")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "contended": self.contended,
            "reasons": list(self.reasons),
            "window_s": self.window_s,
            **{name: _plain(getattr(self, name)) for name in _OPTIONAL if getattr(self, name) is not None},
        }

    @classmethod
    def from_dict(cls, data: object) -> Contention:
        """Read ``to_dict``'s output back; anything else raises ``fields.FieldError`` naming the key."""
        d = fields.record(data, "", ("contended", "reasons", "window_s"), _OPTIONAL)

        def number(name: str, positive: bool = False) -> float | None:
            value = d.get(name)
            return None if value is None else fields.number(value, name, positive=positive)

        def count(name: str) -> int | None:
            value = d.get(name)
            return None if value is None else fields.integer(value, name, minimum=0)

        return cls(
            contended=fields.flag(d["contended"], "contended"),
            reasons=tuple(fields.items(d["reasons"], "reasons", fields.text)),
            window_s=fields.duration(d["window_s"], "window_s"),
            threads=count("threads"),
            logical_cores=count("logical_cores"),
            cpu_share=number("cpu_share"),
            others_cores=number("others_cores"),
            load_start=number("load_start"),
            load_end=number("load_end"),
            steal_pct=number("steal_pct"),
            run_wait_pct=number("run_wait_pct"),
            gpu_processes=count("gpu_processes"),
            sm_clock_mhz=number("sm_clock_mhz", positive=True),
            app_clock_mhz=number("app_clock_mhz", positive=True),
            clock_events=None
            if d.get("clock_events") is None
            else tuple(fields.items(d["clock_events"], "clock_events", fields.text)),
        )


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
