"""``calibrate`` and ``selfcheck``: what the device can do, and whether our timer agrees with the field's.

Both need torch, imported inside the commands so that ``--help`` works without it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from attnbench.cli.common import (
    DeviceOpt,
    FormatOpt,
    ThreadsOpt,
    handles_errors,
    print_json,
    stderr,
    stdout,
    write_or_print,
)
from attnbench.core.errors import AttnbenchError
from attnbench.core.peaks import PEAK_DTYPES
from attnbench.core.units import format_percent, plural

if TYPE_CHECKING:
    from attnbench.analysis.selfcheck import SelfcheckReport
    from attnbench.core.peaks import VendorPeak
    from attnbench.results.calibration import Calibration
    from attnbench.results.selfcheck import SelfcheckTimings

DtypeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--dtype",
        help=f"Matmul dtype to calibrate, repeatable or comma-separated: {', '.join(PEAK_DTYPES)}.",
        show_default="float32, tf32 (GPU), bfloat16, float16",
    ),
]


def _dtypes(given: list[str] | None, device_type: str) -> tuple[str, ...]:
    from attnbench.instrument.ceilings import DEFAULT_DTYPES

    if not given:
        return DEFAULT_DTYPES[device_type]
    names = [name.strip() for item in given for name in item.split(",") if name.strip()]
    unknown = [name for name in names if name not in PEAK_DTYPES]
    if unknown:
        raise AttnbenchError(f"--dtype: unknown dtype {unknown[0]!r}", hint=f"one of: {', '.join(PEAK_DTYPES)}")
    return tuple(dict.fromkeys(names))


@handles_errors
def calibrate(
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    refresh: Annotated[bool, typer.Option("--refresh", help="Measure again even if this machine has a cache.")] = False,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="A short run: on a GPU the ceiling sizes timed briefly (cached; fits a short lease), on a CPU "
            "reduced sizes (a smoke test, not cached).",
        ),
    ] = False,
    threads: ThreadsOpt = None,
    noise_processes: Annotated[
        int,
        typer.Option(
            "--noise-processes",
            min=0,
            max=100,
            help="Fresh processes to time the reference cases in for the between-process noise (compare's noise "
            "floor); 0 skips it.",
        ),
    ] = 8,  # noise.DEFAULT_PROCESSES (imported lazily: the option is read before torch is)
    format: FormatOpt = "table",
) -> None:
    """Measure the device's ceilings (matmul FLOP/s per dtype, copy bandwidth) and the between-process noise once
    per machine, and show them beside the vendor's peaks."""
    from attnbench.analysis.efficiency import vendor_for
    from attnbench.host.devices import resolve_device, resolve_threads, threads_handed_back
    from attnbench.host.inventory import collect_environment
    from attnbench.instrument.ceilings import calibrate as measure_ceilings
    from attnbench.results.calibration import cache_path, foreign, load_cached, save

    resolved = resolve_device(device or "auto")
    with threads_handed_back(resolve_threads(threads, resolved)):  # the count a sweep here runs with
        environment = collect_environment(resolved)
        device_type = environment.device_type
        wanted = _dtypes(dtype, device_type)
        fingerprint = environment.fingerprint()
        cached = None if (refresh or quick) else load_cached(fingerprint)
        why = None if cached is None else foreign(cached, environment.to_dict())
        if why:  # filed under this machine's key but measured elsewhere: measure this one instead
            stderr.print(f"the cached calibration is not of this machine ({why}): measuring again", markup=False)
            cached = None
        if cached is not None and all(d in {m.dtype for m in cached.matmul} | set(cached.skipped) for d in wanted):
            calibration = cached
            origin = f"cached calibration of {cached.created_utc} ({cache_path(fingerprint)}); --refresh measures again"
        else:
            if cached is not None:
                # The cache is one file per machine: measure what it already holds too, or saving would drop it.
                wanted = tuple(dict.fromkeys([*wanted, *(m.dtype for m in cached.matmul), *cached.skipped]))
            stderr.print(
                f"calibrating {resolved} ({environment.gpu_name or environment.cpu_model}, torch {environment.torch}, "
                f"{plural(environment.torch_threads or 0, 'thread')}): {', '.join(wanted)} matmul, then copy bandwidth",
                markup=False,
            )
            calibration = measure_ceilings(
                resolved,
                wanted,
                environment,
                quick=quick,
                progress=lambda line: stderr.print(f"  {line}", markup=False),
            )
            if cached is not None:  # the noise is the machine's, not a dtype's: a cache that gains a dtype keeps it
                calibration = replace(calibration, noise=cached.noise)
            if calibration.quick:
                origin = "measured now (--quick on a CPU: reduced sizes, not cached, not used by sweeps)"
            else:
                origin = f"measured now; cached in {save(calibration)} for sweeps on this machine"
        if calibration.noise is None and noise_processes >= 2 and not quick:
            calibration = _with_noise(calibration, resolved, environment.torch_threads, noise_processes)
            origin += f"; noise floor measured now, cached in {save(calibration)}"
        vendor, why_none = vendor_for(environment.to_dict())
        if format == "json":
            _print_calibration_json(calibration, vendor, device_type, origin, why_none)
            return
        _print_calibration(calibration, vendor, device_type, origin, why_none)


def _print_calibration_json(
    calibration: Calibration, vendor: VendorPeak | None, device_type: str, origin: str, why_none: str
) -> None:
    """The calibration as the cache and run.json store it (SI units), the vendor's figures, and its origin."""
    from attnbench.analysis.efficiency import vendor_line

    print_json(
        {
            "schema": "attnbench.calibrate/1",
            "calibration": calibration.to_dict(),
            "vendor": None
            if vendor is None
            else {
                "name": vendor.name,
                "flops_per_s": dict(vendor.flops_per_s),
                "bandwidth_bytes_per_s": vendor.bandwidth_bytes_per_s,
                "source": vendor.source,
            },
            "vendor_note": vendor_line(calibration.device_name, vendor, device_type, why_none),
            "origin": origin,
        }
    )


def _with_noise(calibration: Calibration, device: str, threads: int | None, processes: int) -> Calibration:
    from attnbench.instrument.noise import measure_noise, reference_cases

    cases = reference_cases(device)
    stderr.print(
        f"measuring the between-process noise: {len(cases)} reference cases in {processes} fresh processes",
        markup=False,
    )
    noise = measure_noise(
        device, threads, processes=processes, progress=lambda line: stderr.print(f"  {line}", markup=False)
    )
    return replace(calibration, noise=noise)


def noise_line(calibration: Calibration) -> str:
    """The between-process noise in words, or how to measure it."""
    noise = calibration.noise
    if noise is None:
        return "between-process noise: not measured (attnbench calibrate --refresh measures it)"
    spreads = ", ".join(format_percent(s) for s in noise.spreads)
    line = (
        f"between-process noise: ±{format_percent(noise.floor)} (95 % interval of the ratio of two processes; "
        f"{noise.processes} "
        f"processes × {len(noise.cases)} reference cases, widest-over-narrowest {spreads}): compare's noise floor "
        "for one process per side"
    )
    if noise.contended:
        line += f"; {noise.contended} of its timings ran on a busy machine, so a quiet machine's floor is lower"
    return line


def _print_calibration(
    calibration: Calibration, vendor: VendorPeak | None, device_type: str, origin: str, why_none: str = ""
) -> None:
    from attnbench.analysis.efficiency import ceiling_rows, vendor_line

    table = Table(
        title=f"ceilings of {calibration.device} ({calibration.device_name}), machine {calibration.fingerprint}",
        title_justify="left",
    )
    for column in ("ceiling", "measured", "at", "vendor peak", "measured / vendor", "pct_of_peak uses"):
        table.add_column(column)
    for row in ceiling_rows(calibration, vendor):
        table.add_row(*(escape(cell) for cell in (row.what, row.measured, row.at, row.vendor, row.ratio, row.used)))
    stdout.print(table)
    stdout.print(vendor_line(calibration.device_name, vendor, device_type, why_none), markup=False)
    stdout.print(noise_line(calibration), markup=False)
    for note in calibration.notes:
        stdout.print(f"note: {note}", markup=False)
    stdout.print(origin, markup=False)


@handles_errors
def selfcheck(
    device: DeviceOpt = None,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="Fewer ops and rounds: on a GPU one gated op per family (a verdict that fits a short lease), on a "
            "CPU tiny ops (a smoke test).",
        ),
    ] = False,
    rounds: Annotated[
        int | None, typer.Option("--rounds", min=1, help="Interleaved rounds per op.", show_default="7, quick 3")
    ] = None,
    max_rounds: Annotated[
        int | None,
        typer.Option(
            "--max-rounds",
            min=1,
            help="Rounds an op may get while its interval straddles the tolerance.",
            show_default="10 × rounds",
        ),
    ] = None,
    output: Annotated[
        str | None, typer.Option("-o", "--output", help="Also write the table as markdown (as JSON with -f json).")
    ] = None,
    threads: ThreadsOpt = None,
    budget_s: Annotated[
        float,
        typer.Option(
            "--budget-s",
            min=1.0,
            help="Wall time the whole check may take: no round starts that would not end within it.",
        ),
    ] = 120.0,
    format: FormatOpt = "table",
) -> None:
    """Time a fixed list of ops with attnbench and with torch.utils.benchmark (and triton's do_bench on a GPU),
    interleaved, within a time budget. An op of ≥ 100 µs (attnbench's time) fails when the 95 % interval of its
    ratio lies beyond ±5 % (±3 % against do_bench), passes when inside; otherwise rounds are added while the budget
    lasts, and it stays inconclusive. Exit 1 on a failure, 5 when some op is inconclusive and none failed, else 0."""
    from attnbench.analysis.selfcheck import decided, judge
    from attnbench.core.units import format_duration
    from attnbench.host.devices import resolve_device, resolve_threads, threads_handed_back
    from attnbench.instrument.agreement import (
        MAX_ROUNDS_FACTOR,
        QUICK_ROUNDS,
        RENDER_S,
        ROUNDS,
        ops_for,
        process_age_s,
        run_selfcheck,
    )
    from attnbench.report.selfcheck_md import selfcheck_dict

    resolved = resolve_device(device or "auto")
    with threads_handed_back(resolve_threads(threads, resolved)):  # the count a sweep here runs with
        least = rounds or (QUICK_ROUNDS if quick else ROUNDS)
        most = max(least, max_rounds or MAX_ROUNDS_FACTOR * least)
        count = len(ops_for(resolved.split(":")[0], quick=quick))
        stderr.print(
            f"selfcheck: {count} ops on {resolved}, {least} paired rounds each (up to {most} while undecided), "
            f"within a {format_duration(budget_s)} budget (--budget-s)",
            markup=False,
        )
        # The budget is the whole command's: start-up (torch's import, seconds) and the table at the end count too.
        spent_s = process_age_s()
        timings = run_selfcheck(
            resolved,
            quick=quick,
            rounds=rounds,
            progress=lambda line: stderr.print(f"selfcheck {line}", markup=False),
            decided=decided,
            max_rounds=max_rounds,
            budget_s=max(1.0, budget_s - spent_s - RENDER_S),
        )
        if timings.elapsed_s is not None:  # say the budget the user gave and the whole command's time against it
            timings = replace(timings, budget_s=budget_s, elapsed_s=spent_s + timings.elapsed_s)
        report = judge(timings)
        if format == "json":
            print_json(selfcheck_dict(report), output)
        else:
            _print_selfcheck(report, timings, budget_s, output)
        if report.exit_code:
            raise typer.Exit(report.exit_code)


def _print_selfcheck(report: SelfcheckReport, timings: SelfcheckTimings, budget_s: float, output: str | None) -> None:
    """The verdicts as a table, the notes, the time taken against the budget and the summary line; the markdown
    table to ``output`` as well when given."""
    from attnbench.analysis.selfcheck import noise_note, summary_line
    from attnbench.core.units import format_duration
    from attnbench.report.selfcheck_md import render_markdown, table_rows

    header, rows = table_rows(report)
    table = Table(
        title=(
            f"selfcheck on {timings.device} ({timings.device_name}), torch {timings.torch}, "
            f"{plural(timings.threads, 'thread')}, {plural(timings.rounds, 'paired round')}; "
            "ratio = attnbench / reference (median of per-round ratios)"
        ),
        title_justify="left",
    )
    for column in header:
        table.add_column(escape(column))
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    stdout.print(table)
    noise = noise_note(report)
    for note in [*timings.notes, *([noise] if noise else [])]:
        stdout.print(f"note: {note}", markup=False)
    if timings.elapsed_s is not None:
        stdout.print(
            f"took {format_duration(timings.elapsed_s)} of its {format_duration(budget_s)} budget",
            markup=False,
        )
    stdout.print(summary_line(report), markup=False)
    if output is not None:
        write_or_print(render_markdown(report), output)
