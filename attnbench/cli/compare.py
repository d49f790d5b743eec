"""``attnbench compare BASE CURRENT``: a noise-aware regression verdict per case (needs no torch).

Exit codes: 0 no regression, 1 a regression, 2 bad input, 3 refused (runs not comparable), 4 no baseline.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from attnbench.cli.common import (
    LATEST_HELP,
    OutputOpt,
    emit,
    handles_errors,
    one_run,
    print_warnings,
)
from attnbench.core.errors import AttnbenchError, ConfigError

if TYPE_CHECKING:
    from attnbench.analysis.thresholds import Thresholds


def read_thresholds(path: Path, fail_on: str | list[str] | None = None) -> Thresholds:
    """A ``--thresholds`` file, read as configs are (``config.source``: a regular UTF-8 file of bounded size, a
    key given twice refused with both lines rather than the last silently kept), then checked."""
    from attnbench.analysis.thresholds import thresholds_from
    from attnbench.config.source import parse_yaml, read_file

    try:
        data, _ = parse_yaml(read_file(path, str(path)), str(path))
    except ConfigError as exc:
        # An error about a key (one given twice) keeps its own hint; the config-file hint fits nothing else here.
        hint = exc.hint if exc.key else "write a mapping such as {default: 5%, lstm: 8%}"
        raise AttnbenchError(f"--thresholds: {exc.message}", hint=hint) from None
    return thresholds_from(data, path, fail_on)


BaseArg = Annotated[
    Path,
    typer.Argument(
        help=f"Base run folder, or a folder of repeated runs (one process each); {LATEST_HELP}",
        show_default=False,
        callback=one_run,
    ),
]
CurrentArg = Annotated[
    Path,
    typer.Argument(
        help=f"Current run folder, or a folder of repeated runs; {LATEST_HELP}", show_default=False, callback=one_run
    ),
]


@handles_errors
def compare(
    base: BaseArg,
    current: CurrentArg,
    fail_on: Annotated[
        list[str] | None,
        typer.Option(
            "--fail-on",
            help="Change a case may show before it can regress: median:P%, or peak_mem:P%, tokens_per_s:P%, "
            "gbps:P% to gate those too (repeatable).",
            show_default="median:5%, or the --thresholds file's default",
        ),
    ] = None,
    thresholds: Annotated[
        Path | None,
        typer.Option(
            "--thresholds",
            help="YAML of thresholds per model, model/mode pattern or metric: {default: 5%, lstm/train: 8%, "
            "peak_mem: 10%}.",
            show_default=False,
        ),
    ] = None,
    noise_floor: Annotated[
        str | None,
        typer.Option(
            "--noise-floor",
            help="Between-process spread assumed when a side has one process: the 95 % half-width of the ratio "
            "between two processes of unchanged code.",
            show_default="the larger floor the runs recorded (attnbench calibrate measures it), else 100%",
        ),
    ] = None,
    allow_mismatch: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-mismatch",
            help="Compare although this key differs (repeatable): device_type, cpu_model, gpu_name, driver_major, "
            "torch, torch_cuda, cudnn, torch_threads, packages, dtypes, config_sha256.",
            show_default=False,
        ),
    ] = None,
    exit_noisy: Annotated[
        int | None,
        typer.Option(
            "--exit-noisy",
            help="Exit with this code when nothing regressed but some case was noisy (git bisect run: 125 skips a "
            "commit compare could not judge, rather than calling it good).",
            show_default=False,
        ),
    ] = None,
    format: Annotated[Literal["table", "md", "json"], typer.Option("--format", "-f")] = "table",
    output: OutputOpt = None,
) -> None:
    """Judge each case of CURRENT against BASE: regressed, improved, same, noisy, new or missing (needs no torch).

    Exit 1 on a regression, 3 when the runs are not comparable, 4 when BASE holds no run (--exit-noisy: its code
    when a case was noisy and none regressed).
    """
    from attnbench.analysis.compare import Policy, compare_paths
    from attnbench.analysis.thresholds import Thresholds, parse_fraction, with_fail_on
    from attnbench.report.formats import COMPARE_FORMATS

    if exit_noisy is not None and not 1 <= exit_noisy <= 255:
        raise AttnbenchError(
            f"--exit-noisy: {exit_noisy} is not an exit code a script can tell apart (0 is success; codes end at 255)",
            hint="1 to 255; 125 makes git bisect run skip the commit",
        )
    limits = read_thresholds(thresholds, fail_on) if thresholds is not None else with_fail_on(Thresholds(), fail_on)
    policy = Policy(
        thresholds=limits,
        noise_floor=None if noise_floor is None else parse_fraction(noise_floor, "--noise-floor", below=10.0),
        allow_mismatch=frozenset(allow_mismatch or ()),
    )
    comparison = compare_paths(base, current, policy)
    reads = [stored.folder for side in (comparison.base, comparison.current) for stored in side.runs]
    emit(COMPARE_FORMATS[format], comparison, output, reads=reads)
    # Warnings after the result, on stderr: they are data about the runs, not part of the verdict table.
    print_warnings(comparison.warnings)
    if comparison.regressed:
        raise typer.Exit(comparison.exit_code)
    if exit_noisy is not None and comparison.of("noisy"):
        raise typer.Exit(exit_noisy)
