"""A device's measured ceilings (``attnbench calibrate``), stored and cached per machine fingerprint.

Torch-free: ``sweep`` stores the cached ``Calibration`` in run.json and ``report`` reads it back to turn
achieved FLOP/s into ``pct_of_peak`` without torch. The measuring is in ``attnbench.instrument.ceilings``.

Cache: one JSON file per ``Environment.fingerprint()`` — the same keys that must match before two runs are
compared (device type, CPU model, GPU name, driver major, torch and CUDA/cuDNN versions, torch threads) — in
``$ATTNBENCH_CACHE``, else ``$XDG_CACHE_HOME/attnbench``, else ``~/.cache/attnbench``.

Schema history (``CALIBRATION_SCHEMA``):
  1 — first version. Added since, optional and absent when not measured: ``noise`` (``NoiseFloor``, the
      machine's between-process spread of a few reference cases, issue 17).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from attnbench.core.errors import AttnbenchError, ResultsError
from attnbench.core.peaks import PEAK_DTYPES
from attnbench.results import fields
from attnbench.results.fields import FieldError

CALIBRATION_SCHEMA = 1

CACHE_ENV = "ATTNBENCH_CACHE"

_FINGERPRINT = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True)
class MatmulCeiling:
    """Dense n×n·n×n matmul throughput for one dtype, ``2·n³`` FLOPs per call, best over the sizes timed.

    ``flops_per_s`` comes from the fastest sample, as STREAM reports its best rate: on a shared machine noise
    only ever adds time, so the fastest sample is the closest to what the hardware sustains. The median's rate
    at the same size is kept beside it.
    """

    dtype: str  # one of peaks.PEAK_DTYPES ("tf32" = float32 data on TF32 tensor cores)
    flops_per_s: float
    size: int  # the n that gave flops_per_s
    by_size: tuple[tuple[int, float], ...]  # (n, best FLOP/s) for every size timed, ascending n
    median_flops_per_s: float | None = None  # at ``size``, from the median sample
    converged: bool = True  # every size's measurement met the stopping rule

    def to_dict(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "flops_per_s": self.flops_per_s,
            "size": self.size,
            "by_size": [[n, rate] for n, rate in self.by_size],
            "median_flops_per_s": self.median_flops_per_s,
            "converged": self.converged,
        }

    @classmethod
    def from_dict(cls, data: object) -> MatmulCeiling:
        d = fields.record(data, "", ("dtype", "flops_per_s", "size", "by_size"), ("median_flops_per_s", "converged"))
        by_size = tuple(fields.items(d["by_size"], "by_size", _size_rate))
        if not by_size:
            raise FieldError("by_size", "expected at least one (size, FLOP/s) pair, found an empty list")
        median = d.get("median_flops_per_s")
        return cls(
            dtype=fields.choice(d["dtype"], "dtype", PEAK_DTYPES, "dtype"),
            flops_per_s=fields.number(d["flops_per_s"], "flops_per_s", positive=True),
            size=fields.integer(d["size"], "size"),
            by_size=by_size,
            median_flops_per_s=None if median is None else fields.number(median, "median_flops_per_s", positive=True),
            converged=fields.flag(d.get("converged", True), "converged"),
        )


def _size_rate(value: object, key: str) -> tuple[int, float]:
    if not isinstance(value, list) or len(value) != 2:
        raise fields.expected(key, "a [size, FLOP/s] pair", value)
    return fields.integer(value[0], fields.path(key, 0)), fields.number(value[1], fields.path(key, 1), positive=True)


@dataclass(frozen=True)
class CopyBandwidth:
    """A device-to-device copy of one buffer into another: (bytes read + bytes written) per second, from the
    fastest sample (STREAM's convention, as for the matmul), with the median's rate beside it."""

    bytes_per_s: float
    buffer_bytes: int  # the size of each of the two buffers
    cache_bytes: int | None = None  # the last-level cache it has to exceed (CPU L3, GPU L2), when known
    median_bytes_per_s: float | None = None
    converged: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "bytes_per_s": self.bytes_per_s,
            "buffer_bytes": self.buffer_bytes,
            "cache_bytes": self.cache_bytes,
            "median_bytes_per_s": self.median_bytes_per_s,
            "converged": self.converged,
        }

    @classmethod
    def from_dict(cls, data: object) -> CopyBandwidth:
        d = fields.record(data, "", ("bytes_per_s", "buffer_bytes"), ("cache_bytes", "median_bytes_per_s", "converged"))
        cache, median = d.get("cache_bytes"), d.get("median_bytes_per_s")
        return cls(
            bytes_per_s=fields.number(d["bytes_per_s"], "bytes_per_s", positive=True),
            buffer_bytes=fields.integer(d["buffer_bytes"], "buffer_bytes"),
            cache_bytes=None if cache is None else fields.integer(cache, "cache_bytes"),
            median_bytes_per_s=None if median is None else fields.number(median, "median_bytes_per_s", positive=True),
            converged=fields.flag(d.get("converged", True), "converged"),
        )


@dataclass(frozen=True)
class NoiseFloor:
    """How far the same case moves between fresh processes on this machine: ``compare``'s noise floor, measured.

    A few reference cases are timed in ``processes`` fresh worker processes each; ``sigma_log`` is the standard
    deviation of the log medians between processes, pooled over the cases, and ``floor`` the half-width of a 95 %
    interval of the ratio of two single processes, ``exp(t₀.₉₇₅(df) · √2 · sigma_log) − 1`` with df the pooled
    degrees of freedom: the figure ``compare`` widens a one-process-per-side interval by."""

    floor: float
    sigma_log: float
    processes: int
    cases: tuple[str, ...]  # the reference cases' keys
    spreads: tuple[float, ...]  # per case: the largest process median over the smallest, minus 1
    measured_utc: str
    contended: int = 0  # rows timed on a busy machine while measuring: the floor is then larger than a quiet one

    def to_dict(self) -> dict[str, Any]:
        return {
            "floor": self.floor,
            "sigma_log": self.sigma_log,
            "processes": self.processes,
            "cases": list(self.cases),
            "spreads": list(self.spreads),
            "measured_utc": self.measured_utc,
            "contended": self.contended,
        }

    @classmethod
    def from_dict(cls, data: object) -> NoiseFloor:
        d = fields.record(
            data, "", ("floor", "sigma_log", "processes", "cases", "spreads", "measured_utc"), ("contended",)
        )
        cases = tuple(fields.items(d["cases"], "cases", fields.text))
        spreads = tuple(fields.items(d["spreads"], "spreads", lambda v, k: fields.number(v, k)))
        if len(spreads) != len(cases):
            raise FieldError("spreads", f"expected one spread per case ({len(cases)}), found {len(spreads)}")
        return cls(
            floor=fields.number(d["floor"], "floor"),
            sigma_log=fields.number(d["sigma_log"], "sigma_log"),
            processes=fields.integer(d["processes"], "processes", minimum=2),
            cases=cases,
            spreads=spreads,
            measured_utc=fields.text(d["measured_utc"], "measured_utc"),
            contended=fields.integer(d.get("contended", 0), "contended", minimum=0),
        )


@dataclass(frozen=True)
class Calibration:
    """What one device sustains, measured once per machine fingerprint and stored with each run."""

    fingerprint: str  # Environment.fingerprint() of the machine and stack it was measured on
    device: str  # "cpu", "cuda:0"
    device_name: str  # the GPU's name, or the CPU model
    created_utc: str
    torch: str | None
    torch_threads: int | None
    matmul: tuple[MatmulCeiling, ...]
    copy: CopyBandwidth | None = None
    skipped: Mapping[str, str] = field(default_factory=dict)  # dtype → why it was not measured
    notes: tuple[str, ...] = ()  # caveats a reader should see (a buffer close to the cache size, …)
    quick: bool = False  # reduced sizes (tests, smoke runs): never cached, never a ceiling to trust
    schema_version: int = CALIBRATION_SCHEMA
    noise: NoiseFloor | None = None  # the between-process spread (compare's noise floor), when measured

    def matmul_for(self, dtype: str) -> MatmulCeiling | None:
        return next((m for m in self.matmul if m.dtype == dtype), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "fingerprint": self.fingerprint,
            "device": self.device,
            "device_name": self.device_name,
            "created_utc": self.created_utc,
            "torch": self.torch,
            "torch_threads": self.torch_threads,
            "matmul": [m.to_dict() for m in self.matmul],
            "copy": None if self.copy is None else self.copy.to_dict(),
            "skipped": dict(self.skipped),
            "notes": list(self.notes),
            "quick": self.quick,
            **({} if self.noise is None else {"noise": self.noise.to_dict()}),
        }

    @classmethod
    def from_dict(cls, data: object) -> Calibration:
        """Read ``to_dict``'s output back; anything else raises ``fields.FieldError`` naming the key."""
        d = fields.record(data, "", _REQUIRED, _OPTIONAL)
        version = fields.integer(d["schema_version"], "schema_version")
        if version > CALIBRATION_SCHEMA:
            raise FieldError("schema_version", f"{version} is newer than this attnbench reads ({CALIBRATION_SCHEMA})")
        fingerprint = fields.text(d["fingerprint"], "fingerprint")
        if not _FINGERPRINT.fullmatch(fingerprint):
            raise fields.expected("fingerprint", "16 lowercase hex digits", fingerprint)
        matmul = tuple(fields.items(d["matmul"], "matmul", lambda v, k: fields.nested(k, MatmulCeiling.from_dict, v)))
        dtypes = [m.dtype for m in matmul]
        if len(set(dtypes)) != len(dtypes):
            raise FieldError("matmul", f"a dtype is listed twice ({', '.join(dtypes)})")
        copy, threads, torch = d.get("copy"), d.get("torch_threads"), d.get("torch")
        skipped = d.get("skipped", {})
        if not isinstance(skipped, dict):
            raise fields.expected("skipped", "an object", skipped)
        return cls(
            fingerprint=fingerprint,
            device=fields.text(d["device"], "device"),
            device_name=fields.text(d["device_name"], "device_name"),
            created_utc=fields.text(d["created_utc"], "created_utc"),
            torch=None if torch is None else fields.text(torch, "torch"),
            torch_threads=None if threads is None else fields.integer(threads, "torch_threads"),
            matmul=matmul,
            copy=None if copy is None else fields.nested("copy", CopyBandwidth.from_dict, copy),
            skipped=MappingProxyType(
                {fields.text(k, "skipped"): fields.text(v, fields.path("skipped", k)) for k, v in skipped.items()}
            ),
            notes=tuple(fields.items(d.get("notes", []), "notes", fields.text)),
            quick=fields.flag(d.get("quick", False), "quick"),
            schema_version=version,
            noise=None if d.get("noise") is None else fields.nested("noise", NoiseFloor.from_dict, d["noise"]),
        )


def foreign(calibration: Calibration, environment: Mapping[str, Any]) -> str | None:
    """Why ``calibration`` was not measured in ``environment`` (a run.json's, or ``Environment.to_dict()``), or None
    when it was: the same machine fingerprint, device type, device, torch and torch threads. A calibration applies
    only to what it measured: one copied from another machine into a run.json, or filed in this machine's cache
    under its key but measured elsewhere, would set another machine's noise floor and peaks (issue 50 §3.2)."""
    from attnbench.results.environment import Environment

    fingerprint: object
    try:  # the fingerprint of what the run.json says, not the one it stores beside it (a copy may keep a stale one)
        fingerprint = Environment.from_dict(environment).fingerprint()
    except (TypeError, ValueError):  # a partial environment: the fingerprint it stores, if any
        fingerprint = environment.get("fingerprint")
    device_type = str(environment.get("device_type") or environment.get("device") or "").split(":")[0]
    name = environment.get("gpu_name") or environment.get("cpu_model")
    checks = (
        ("machine fingerprint", calibration.fingerprint, fingerprint),
        ("device", calibration.device.split(":")[0], device_type),
        ("device name", calibration.device_name, name),
        ("torch", calibration.torch, environment.get("torch")),
        ("torch threads", calibration.torch_threads, environment.get("torch_threads")),
    )
    for what, measured, here in checks:
        # A field the run does not record (an older or partial run.json) cannot tell; every recorded one must match.
        if here is not None and here != "" and measured != here:
            return f"it was measured with {what} {measured!s:.60}, the run has {here!s:.60}"
    return None


_REQUIRED = ("schema_version", "fingerprint", "device", "device_name", "created_utc", "matmul")

_OPTIONAL = ("torch", "torch_threads", "copy", "skipped", "notes", "quick", "noise")


def cache_dir() -> Path:
    """``$ATTNBENCH_CACHE``, else ``$XDG_CACHE_HOME/attnbench``, else ``~/.cache/attnbench``."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "attnbench"


def cache_path(fingerprint: str, directory: Path | None = None) -> Path:
    if not _FINGERPRINT.fullmatch(fingerprint):
        # The fingerprint becomes a file name: never let anything but hex digits into it.
        raise ValueError(f"not a machine fingerprint: {fingerprint!r}")
    return (directory or cache_dir()) / f"calibration-{fingerprint}.json"


_CACHE_HINT = "delete the file, or measure again with 'attnbench calibrate --refresh'"


def load_cached(fingerprint: str, directory: Path | None = None) -> Calibration | None:
    """The cached calibration for this fingerprint, or None when there is none. A damaged file, or one that
    belongs to another fingerprint, is a ``ResultsError`` naming it."""
    from attnbench.results.files import read_bounded

    path = cache_path(fingerprint, directory)
    if not os.path.lexists(path):
        return None
    try:
        text = read_bounded(path, _CACHE_HINT).decode("utf-8")  # a regular file, bounded: it may be anyone's
    except UnicodeDecodeError as exc:
        raise ResultsError(f"{path}: cannot read the cached calibration ({exc})", hint=_CACHE_HINT) from None
    try:
        calibration = Calibration.from_dict(json.loads(text))
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path}: not valid JSON: {exc.msg} (line {exc.lineno})", hint=_CACHE_HINT) from None
    except FieldError as exc:
        where = f", key '{exc.key}'" if exc.key else ""
        raise ResultsError(f"{path}{where}: {exc.problem}", hint=_CACHE_HINT) from None
    if calibration.fingerprint != fingerprint:
        raise ResultsError(
            f"{path}: holds the calibration of machine {calibration.fingerprint}, not {fingerprint}",
            hint=_CACHE_HINT,
        )
    return calibration


def save(calibration: Calibration, directory: Path | None = None) -> Path:
    """Write the calibration to its cache file (atomically) and return the path."""
    # Imported here: results imports this module for Run.calibration.
    from attnbench.results.files import write_atomic

    path = cache_path(calibration.fingerprint, directory)
    hint = f"set {CACHE_ENV} to a writable folder"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AttnbenchError(f"cannot write the calibration cache {path}: {exc.strerror or exc}", hint=hint) from None
    try:
        write_atomic(path, json.dumps(calibration.to_dict(), indent=2, allow_nan=False) + "\n")
    except ResultsError as exc:  # a full disk, a link where the cache file should be: named, with our hint
        raise type(exc)(f"the calibration cache {exc.message}", hint=hint) from None
    return path
