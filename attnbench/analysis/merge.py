"""``attnbench merge``: the run folders of one config (the shards of a sweep, on one machine or many) read as one
run, with the contract of a run a single sweep wrote. Deciding the merge is here; writing the folder is
``results.merged``'s job and rendering its summaries ``report.run_files``'s. Torch-free.

A merge refuses, rather than guesses, when the pieces do not make one run:

* **different configs** (``config_sha256``), or shards of different splits (3 vs 4): exit 2;
* **a case with two different rows** (a shard swept twice and both folders given): exit 2, naming both;
  identical rows (an earlier merge given beside its shards) are kept once;
* **environments that are not comparable**: the keys ``compare`` holds hard (``compare.HARD_KEYS``: device, CPU,
  GPU, driver, torch, CUDA, cuDNN, threads) and the code that measured (attnbench, git commit, flash-attn), as
  a resume does: exit 3, each difference listed as ``compare`` lists them, unless ``--allow-mismatch KEY``;
* **an incomplete set** (a shard without a folder, a shard whose task died part-way, a folder that does not read):
  exit 2 naming the shards and cases, unless ``--partial``, which merges what is there and says what is not.

The merged rows are in the config's case order, so a merge of every shard lists its cases exactly as the unsharded
sweep does. Merging is deterministic — the same inputs give the same folder byte for byte — and never writes to
its inputs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnbench.analysis.compare import HARD_KEYS, Mismatch, NotComparableError, allowed_keys, hard_fields
from attnbench.core.cases import Case
from attnbench.core.errors import AttnbenchError, ResultsError
from attnbench.core.shards import Shard, shard_of
from attnbench.results import store
from attnbench.results.merged import telemetry_lines
from attnbench.results.records import Result, Run, Source
from attnbench.results.store import RUN_FILE, StoredRun, load_run

# What must match before rows may share a run: what compare holds hard, and the code that measured (as resume).
CODE_KEYS: tuple[str, ...] = ("attnbench", "git_commit")
MERGE_KEYS: tuple[str, ...] = (*HARD_KEYS, *CODE_KEYS)

_LISTED = 5  # cases, conflicts and folders named one by one in a message before "and N more"


class IncompleteMergeError(ResultsError):
    """Cases or shards are missing and ``--partial`` was not given."""


@dataclass(frozen=True)
class MergePlan:
    """Everything the merged folder holds, and what the merge found on the way."""

    run: Run
    results: tuple[Result, ...]  # in the config's case order
    telemetry: tuple[str, ...]  # raw-telemetry lines of the kept rows
    sources: tuple[StoredRun, ...]  # in shard order
    shards: int | None  # N of an i/N split, when the inputs are shards
    missing_shards: tuple[int, ...]  # shards that hold cases but have no run folder here
    missing: tuple[Case, ...]  # the config's cases without a row
    skipped: tuple[str, ...]  # folders left out (--partial): each a located error
    allowed: tuple[Mismatch, ...]  # differences --allow-mismatch let through
    duplicates: int  # identical rows found twice and kept once
    warnings: tuple[str, ...] = ()
    expected: int | None = None  # cases in the config (None: the stored config could not be expanded)

    @property
    def complete(self) -> bool:
        return not self.missing and not self.missing_shards and not self.skipped

    def gaps(self) -> list[str]:
        """What is missing, in words: one entry per shard (or one for the whole run)."""
        return describe_missing(self.missing, self.missing_shards, self.shards, self.sources)


# ------------------------------------------------------------------------------------------------ the inputs


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def run_folders(paths: Iterable[Path], exclude: Path | None = None) -> list[Path]:
    """Each path itself when it holds run.json, else the run folders directly inside it (name order, leaving out
    ``exclude``: a merge's own output beside its shards). A folder in which a sweep died before writing run.json is
    not a run; its cases show as missing."""
    folders: list[Path] = []
    for given in paths:
        path = Path(given)
        if not path.exists():
            raise ResultsError(f"{path}: no such run folder", hint="pass the shards' run folders, or a folder of them")
        inside = [p for p in store.run_folders(path) if p == path or exclude is None or p.resolve() != exclude]
        if not inside:
            raise ResultsError(
                f"{path}: holds no run (no {RUN_FILE}, no run folders inside)",
                hint="pass run folders written by 'attnbench sweep --shard i/N', or the folder that holds them",
            )
        folders += inside
    unique = list(dict.fromkeys(p.resolve() for p in folders))
    return [next(p for p in folders if p.resolve() == r) for r in unique]


def _load(folders: Sequence[Path], partial: bool) -> tuple[list[StoredRun], list[str]]:
    runs: list[StoredRun] = []
    skipped: list[str] = []
    for folder in folders:
        try:
            runs.append(load_run(folder))
        except ResultsError as exc:
            if not partial:
                raise ResultsError(
                    exc.message,
                    hint=f"{exc.hint}; or merge the other shards with --partial (this one's cases show as missing)",
                ) from None
            skipped.append(exc.message)
    if not runs:
        raise ResultsError(
            "no run to merge: " + ("; ".join(skipped) if skipped else "no run folders given"),
            hint="pass run folders written by 'attnbench sweep --shard i/N'",
        )
    return runs, skipped


def _check_output(out: Path, given: Sequence[Path], runs: Sequence[StoredRun]) -> None:
    """The output is never an input, nor inside one, and only an earlier merge of this config is replaced."""
    target = out.resolve()
    for path in [*given, *(r.folder for r in runs)]:
        source = Path(path).resolve()
        if _inside(target, source) or _inside(source, target):
            raise AttnbenchError(
                f"-o {out}: overlaps the input {path}; a merge never writes into what it reads",
                hint="choose an output folder outside the shards, e.g. -o results/runs/<name>",
            )
    if not out.exists():
        return
    if not out.is_dir() or not (out / RUN_FILE).exists():
        if out.is_dir() and not any(out.iterdir()):
            return
        raise AttnbenchError(
            f"-o {out}: exists and is not a run folder", hint="choose a new folder (merge replaces only its own)"
        )
    try:
        previous = load_run(out).run
    except ResultsError as exc:
        raise AttnbenchError(
            f"-o {out}: exists and does not read ({exc.message})", hint="choose a new folder, or remove this one"
        ) from None
    if not previous.merged_from:
        raise AttnbenchError(
            f"-o {out}: holds a run a sweep wrote, which a merge never replaces",
            hint="choose a new folder for the merge (or pass this run as one of its inputs)",
        )
    if previous.config_sha256 != runs[0].run.config_sha256:
        raise AttnbenchError(
            f"-o {out}: holds the merge of another config (sha256 {previous.config_sha256[:12]}…)",
            hint="choose a new folder for this merge",
        )


# ---------------------------------------------------------------------------------------------------- checks


def _shards_of(stored: StoredRun) -> list[Shard]:
    """The slices a run holds: its own, or those of the runs an earlier merge joined."""
    if stored.run.shard is not None:
        return [stored.run.shard]
    return [s.shard for s in stored.run.merged_from if s.shard is not None]


def _check_configs(runs: Sequence[StoredRun]) -> None:
    first = runs[0].run
    others = [r for r in runs[1:] if r.run.config_sha256 != first.config_sha256]
    if not others:
        return
    other = others[0]
    keys = sorted(
        k for k in set(first.config) | set(other.run.config) if first.config.get(k) != other.run.config.get(k)
    )
    raise ResultsError(
        f"the runs are of different configs: {runs[0].folder} ({first.config_source}, sha256 "
        f"{first.config_sha256[:12]}…) and {other.folder} ({other.run.config_source}, sha256 "
        f"{other.run.config_sha256[:12]}…) differ in {', '.join(keys) or 'their resolved config'}",
        hint="merge the shards of one sweep: every shard runs the same config (sweep CONFIG --shard i/N)",
    )


def _check_split(runs: Sequence[StoredRun]) -> int | None:
    counts = {s.count: stored.folder for stored in runs for s in _shards_of(stored)}
    if len(counts) > 1:
        listing = ", ".join(f"{folder} is 1 of {n}" for n, folder in sorted(counts.items()))
        raise ResultsError(
            f"the shards come from different splits ({listing})",
            hint="merge shards of one split: sweep --shard i/N with the same N",
        )
    return next(iter(counts), None)


def _merge_fields(stored: StoredRun) -> dict[str, Any]:
    env = stored.run.environment
    return {**hard_fields(stored), **{key: env.get(key) for key in CODE_KEYS}}


def check_environments(runs: Sequence[StoredRun], allow: Iterable[str] = ()) -> tuple[Mismatch, ...]:
    """The differences ``allow`` lets through; any other raises ``NotComparableError`` (exit 3)."""
    allowed = allowed_keys(allow, MERGE_KEYS)
    first = _merge_fields(runs[0])
    found: list[Mismatch] = []
    refused: list[str] = []
    for stored in runs[1:]:
        fields = _merge_fields(stored)
        for key in MERGE_KEYS:
            if fields[key] != first[key]:
                mismatch = Mismatch(key, first[key], fields[key])
                if key in allowed:
                    found.append(mismatch)
                else:
                    refused.append(mismatch.describe(runs[0].run.run_id, stored.run.run_id))
    if refused:
        keys = sorted({text.split(":", 1)[0] for text in refused})
        raise NotComparableError(
            "the runs were measured in environments that are not comparable: " + "; ".join(refused),
            hint="merge runs of one machine type and software stack; to merge anyway, "
            + " ".join(f"--allow-mismatch {k}" for k in keys),
        )
    return tuple(found)


def _rows(runs: Sequence[StoredRun]) -> tuple[dict[str, tuple[Result, StoredRun]], int]:
    """One row per case key over every run, and how many identical duplicates were dropped. Two different rows
    for one key are a ``ResultsError`` naming both folders."""
    rows: dict[str, tuple[Result, StoredRun]] = {}
    conflicts: list[str] = []
    duplicates = 0
    for stored in runs:
        for result in stored.results:
            key = result.case.key
            if key not in rows:
                rows[key] = (result, stored)
            elif rows[key][0].to_dict() == result.to_dict():
                duplicates += 1
            else:
                first, where = rows[key]
                conflicts.append(
                    f"{key}: {first.status} in {where.folder}, {result.status} in {stored.folder}"
                    + (" (two measurements)" if first.status == result.status else "")
                )
    if conflicts:
        more = f"; and {len(conflicts) - _LISTED} more" if len(conflicts) > _LISTED else ""
        raise ResultsError(
            f"{len(conflicts)} case(s) have two different rows: " + "; ".join(conflicts[:_LISTED]) + more,
            hint="give each shard's folder once (a shard swept twice leaves two folders: keep one)",
        )
    return rows, duplicates


# ------------------------------------------------------------------------------------------------- the merge


def describe_missing(
    missing: Sequence[Case], missing_shards: Sequence[int], shards: int | None, runs: Sequence[StoredRun]
) -> list[str]:
    """One line per shard with missing cases (or one for an unsharded set), naming a few of the cases."""
    if not missing:
        return []
    if shards is None:
        return [f"{len(missing)} case(s) without a row: {_some(missing)}"]
    folders = {s.index: stored.folder for stored in runs for s in _shards_of(stored) if stored.run.shard is not None}
    lines = []
    for index in sorted({shard_of(c.key, shards) for c in missing}):
        cases = [c for c in missing if shard_of(c.key, shards) == index]
        if index in missing_shards:
            lines.append(f"shard {index}/{shards}: no run folder ({len(cases)} case(s): {_some(cases)})")
        else:
            where = f" in {folders[index]}" if index in folders else ""
            lines.append(f"shard {index}/{shards}: {len(cases)} case(s) without a row{where}: {_some(cases)}")
    return lines


def _some(cases: Sequence[Case]) -> str:
    shown = ", ".join(c.label for c in cases[:_LISTED])
    return shown + (f" and {len(cases) - _LISTED} more" if len(cases) > _LISTED else "")


def _sources(runs: Sequence[StoredRun], kept: dict[str, tuple[Result, StoredRun]]) -> tuple[Source, ...]:
    """Provenance of the merged run: each shard run (an earlier merge contributes the runs it was made of)."""
    counts: dict[Path, int] = {}
    for _, stored in kept.values():
        counts[stored.folder] = counts.get(stored.folder, 0) + 1
    sources: dict[str, Source] = {}
    for stored in runs:
        if stored.run.merged_from:
            for source in stored.run.merged_from:
                sources.setdefault(source.run_id, source)
            continue
        env = stored.run.environment
        sources.setdefault(
            stored.run.run_id,
            Source(
                stored.run.run_id,
                stored.run.shard,
                str(env.get("hostname", "")),
                str(env.get("device", "")),
                counts.get(stored.folder, 0),
            ),
        )
    return tuple(sources.values())


def _order(stored: StoredRun) -> tuple[int, str, str]:
    shards = _shards_of(stored)
    return (min(s.index for s in shards) if shards else -1, stored.run.created_utc, stored.run.run_id)


@dataclass(frozen=True)
class MergeInputs:
    """The runs a merge reads, checked to make one run (``read_inputs``): what ``plan_merge`` decides from."""

    runs: tuple[StoredRun, ...]  # in shard order
    skipped: tuple[str, ...]  # folders left out (--partial): each a located error
    shards: int | None
    allowed: tuple[Mismatch, ...]
    kept: Mapping[str, tuple[Result, StoredRun]]  # one row per case key, with the run it came from
    duplicates: int
    partial: bool  # --partial: merge what is there and say what is not

    @property
    def config(self) -> Run:
        """The run whose stored config every input shares: it says which cases the merged run should hold."""
        return self.runs[0].run


def read_inputs(
    paths: Sequence[Path], out: Path, *, partial: bool = False, allow_mismatch: Iterable[str] = ()
) -> MergeInputs:
    """Read the inputs (run folders, or folders of them) and check that they make one run written to ``out``.
    Raises ``ResultsError`` (exit 2) or ``NotComparableError`` (exit 3)."""
    folders = run_folders(paths, exclude=out.resolve())
    runs, skipped = _load(folders, partial)
    runs.sort(key=_order)
    _check_output(out, paths, runs)
    _check_configs(runs)
    shards = _check_split(runs)
    allowed = check_environments(runs, allow_mismatch)
    kept, duplicates = _rows(runs)
    return MergeInputs(tuple(runs), tuple(skipped), shards, allowed, kept, duplicates, partial)


def plan_merge(
    inputs: MergeInputs,
    out: Path,
    *,
    expected: Sequence[Case] | None,
    command: Sequence[str] = (),
) -> MergePlan:
    """Decide the merged run written to ``out``. ``expected`` is every case of the inputs' stored config (None when
    it could not be expanded), to find what is missing. Raises ``IncompleteMergeError`` (exit 2) when something is
    and the inputs were not read ``partial``."""
    runs, kept, shards = list(inputs.runs), dict(inputs.kept), inputs.shards
    skipped, allowed, duplicates = list(inputs.skipped), inputs.allowed, inputs.duplicates
    warnings = [w for stored in runs for w in stored.warnings]

    cases = expected
    if cases is None:
        warnings.append("the stored config could not be expanded into its cases: missing cases are not checked")
        order, missing = list(kept), []
    else:
        keys = {c.key for c in cases}
        order = [c.key for c in cases if c.key in kept] + [k for k in kept if k not in keys]
        missing = [c for c in cases if c.key not in kept]
        stray = [k for k in kept if k not in keys]
        if stray:
            warnings.append(f"{len(stray)} row(s) are not cases of the config (kept, at the end): {stray[0]}")
    seen = {s.index for stored in runs for s in _shards_of(stored)}
    holding = {shard_of(c.key, shards) for c in cases or ()} if shards is not None else set()
    missing_shards = tuple(sorted(holding - seen))
    if not inputs.partial and (missing or missing_shards):
        gaps = describe_missing(missing, missing_shards, shards, runs)
        raise IncompleteMergeError(
            f"{len(missing)} of {len(cases or ())} cases have no row: " + "; ".join(gaps),
            hint="finish the shards (attnbench sweep --resume SHARD_RUN, or attnbench submit --resume FOLDER), "
            "or merge what is there with --partial",
        )

    telemetry = _telemetry(runs, kept, warnings)
    results = tuple(kept[key][0] for key in order)
    first = runs[0].run
    calibrations = {_calibration_id(r.run) for r in runs}
    if len(calibrations) > 1:
        warnings.append("the shards cached different calibrations: the merged run keeps none (vendor peaks apply)")
    finished = [r.run.finished_utc for r in runs]
    run = Run(
        run_id=out.name,
        created_utc=min(r.run.created_utc for r in runs),
        config_source=first.config_source,
        config=first.config,
        config_sha256=first.config_sha256,
        timing=first.timing,
        environment=first.environment,
        command=tuple(command),
        state="complete" if not missing and not missing_shards and not skipped else "interrupted",
        finished_utc=max(finished) if all(finished) else "",
        calibration=first.calibration if len(calibrations) == 1 else None,
        merged_from=_sources(runs, kept),
    )
    return MergePlan(
        run=run,
        results=results,
        telemetry=tuple(telemetry),
        sources=tuple(runs),
        shards=shards,
        missing_shards=missing_shards,
        missing=tuple(missing),
        skipped=tuple(skipped),
        allowed=allowed,
        duplicates=duplicates,
        warnings=tuple(warnings),
        expected=None if cases is None else len(cases),
    )


def _calibration_id(run: Run) -> str:
    """The cached calibration as text, to tell whether every shard carried the same one."""
    return "" if run.calibration is None else json.dumps(run.calibration.to_dict(), sort_keys=True)


def _telemetry(runs: Sequence[StoredRun], kept: dict[str, tuple[Result, StoredRun]], warnings: list[str]) -> list[str]:
    """The sidecar lines of the kept rows (matched by key and start time), each once."""
    wanted = {(key, result.started_utc): stored.folder for key, (result, stored) in kept.items()}
    lines: dict[str, None] = {}
    for stored in runs:
        found, problems = telemetry_lines(stored.folder)
        warnings += problems
        for key, started, line in found:
            if wanted.get((key, started)) is not None:
                lines.setdefault(line, None)
    return list(lines)
