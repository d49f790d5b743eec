"""``attnbench publish RUN_OR_FOLDER... -o SITE``: a static site over the runs' history (needs no torch).

Into an existing site it adds the new runs to those the site already holds (its ``data/runs/*.json`` digests) and
writes only the files whose bytes changed, so a page whose numbers stayed the same is left as it was (and a git
branch that serves the site, such as gh-pages, gets a small diff).

Exit codes: 0, 2 bad input (a folder that is not a site, a digest that does not read, no runs at all).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from attnbench.cli.common import handles_errors, print_warnings, stdout
from attnbench.core.errors import AttnbenchError
from attnbench.core.units import plural

if TYPE_CHECKING:
    from attnbench.analysis.site import RunDigest

RunsArg = Annotated[
    list[Path] | None,
    typer.Argument(
        help="Run folders, or folders that hold them (a rolling history); none: re-render the site's own runs.",
        show_default=False,
    ),
]
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")
SITE_FILE = Path("data") / "site.json"


def read_site(site: Path) -> list[RunDigest]:
    """The digests an existing site holds; none for a folder that does not exist or is empty. A folder with other
    things in it is refused, so publish never writes over what it did not make."""
    from attnbench.analysis.site import RunDigest
    from attnbench.report.site import SITE_SCHEMA
    from attnbench.results.files import read_bounded

    if not site.exists():
        return []
    if not site.is_dir():
        raise AttnbenchError(f"-o {site}: not a folder", hint="name a folder for the site (it is made if missing)")
    if not (site / SITE_FILE).exists():
        if any(site.iterdir()):
            raise AttnbenchError(
                f"-o {site}: holds files but no {SITE_FILE}, so it is not a site attnbench published",
                hint="publish into an empty or new folder, or into a site made by attnbench publish",
            )
        return []
    hint = "a site's data/ is written by attnbench publish; publish into a new folder to start again"
    try:
        manifest = json.loads(read_bounded(site / SITE_FILE, hint))
    except (ValueError, UnicodeDecodeError) as exc:
        raise AttnbenchError(f"{site / SITE_FILE}: not JSON ({exc})", hint=hint) from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SITE_SCHEMA:
        found = manifest.get("schema") if isinstance(manifest, dict) else type(manifest).__name__
        raise AttnbenchError(f"{site / SITE_FILE}: schema {found!r}, expected {SITE_SCHEMA!r}", hint=hint)
    digests = []
    for path in sorted((site / "data" / "runs").glob("*.json")):
        try:
            data = json.loads(read_bounded(path, hint))
        except (ValueError, UnicodeDecodeError) as exc:
            raise AttnbenchError(f"{path}: not JSON ({exc})", hint=hint) from None
        digests.append(RunDigest.from_dict(data, str(path)))
    return digests


def write_site(site: Path, files: dict[str, bytes]) -> tuple[list[str], list[str]]:
    """Write each file whose bytes differ from what is there (atomically, never through a link); (written, same).
    Every path is checked before the first write: a folder inside the site that is a link (``assets`` pointing
    elsewhere) would carry the writes out of the site, so it is refused and nothing is written."""
    from attnbench.results.files import make_subfolder, refuse_special, write_atomic

    paths: dict[str, Path] = {}
    for name in sorted(files):
        parts = name.split("/")
        if not all(SAFE_NAME.fullmatch(part) for part in parts):
            raise AttnbenchError(
                f"publish: {name!r} is not a safe file name", hint="run ids are slugs: A-Z a-z 0-9 . _ -"
            )
        folder = site
        for part in parts[:-1]:  # the site's own folder may be a link (a checkout elsewhere); nothing below it
            folder = folder / part
            if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
                raise AttnbenchError(
                    f"-o {site}: {folder.relative_to(site)} is {'a link' if folder.is_symlink() else 'a file'}, "
                    "not a folder of the site",
                    hint="publish writes only into folders it made itself; remove it, or publish into a new folder",
                )
        paths[name] = site.joinpath(*parts)
        refuse_special(paths[name])
    written, same = [], []
    for name, path in paths.items():
        data = files[name]
        if path.is_file() and not path.is_symlink() and path.read_bytes() == data:
            same.append(name)
            continue
        site.mkdir(parents=True, exist_ok=True)
        folder = site
        for part in name.split("/")[:-1]:
            folder = make_subfolder(folder / part)  # made here, or refused if a link appeared since the check
        write_atomic(path, data)
        written.append(name)
    return written, same


@handles_errors
def publish(
    runs: RunsArg = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="The site's folder (made if missing).")] = Path("site"),
    title: Annotated[str, typer.Option("--title", help="The site's name, on every page.")] = "attnbench",
    commit_url: Annotated[
        str | None,
        typer.Option(
            "--commit-url",
            help="Link commits: a URL with {commit}, e.g. https://github.com/OWNER/REPO/commit/{commit}.",
            show_default=False,
        ),
    ] = None,
    repo: Annotated[
        Path | None,
        typer.Option("--repo", help="Git checkout that orders the runs' commits.", show_default="this folder"),
    ] = None,
    skip_bad: Annotated[
        bool, typer.Option("--skip-bad", help="Leave out run folders that do not read, with a warning.")
    ] = False,
) -> None:
    """Publish the runs' history as a static site: a page per case with an interactive graph over the runs, the
    regressions (confirmed steps, newest first) and the runs' environments. Works from the file system and GitHub
    Pages; fetches nothing. Publishing into an existing site adds the new runs and rewrites only what changed."""
    from attnbench.analysis.site import RunDigest, build_site
    from attnbench.core.units import format_bytes
    from attnbench.report.site import render_site
    from attnbench.report.site_assets import plotly_js
    from attnbench.results.store import load_runs

    if commit_url is not None and "{commit}" not in commit_url:
        raise AttnbenchError(
            f"--commit-url: {commit_url!r} has no {{commit}}", hint="e.g. https://github.com/OWNER/REPO/commit/{commit}"
        )
    if commit_url is not None and not re.match(r"https?://[^/?#{}\s]+/", commit_url):
        # Every page links each commit through it: a javascript: or data: URL would run in the reader's browser.
        raise AttnbenchError(
            f"--commit-url: {commit_url!r} is not an http(s) address",
            hint="e.g. https://github.com/OWNER/REPO/commit/{commit}",
        )
    held = {d.run.run_id: d for d in read_site(output)}
    on_site = set(held)
    stored, warnings = load_runs(runs or [], skip_bad=skip_bad) if runs else ([], [])
    added = 0
    for digest in (RunDigest.of(s) for s in stored):
        if not SAFE_NAME.fullmatch(digest.run.run_id):
            raise AttnbenchError(
                f"run {digest.run.run_id!r}: its id is not a slug", hint="run ids are A-Z a-z 0-9 . _ -"
            )
        before = held.get(digest.run.run_id)
        if before is not None and before.run.created_utc != digest.run.created_utc:
            # Ids are made to the second: two sweeps started in the same second into two --out folders share one.
            # Replacing the published run with the other would lose it without a word.
            where = f"{output} already holds" if digest.run.run_id in on_site else "this publish was given"
            raise AttnbenchError(
                f"run {digest.run.run_id!r}: {where} another run of this id (created {before.run.created_utc}; "
                f"this one {digest.run.created_utc})",
                hint="publish one of the two to another site folder",
            )
        added += before is None
        held[digest.run.run_id] = digest
    if not held:
        raise AttnbenchError(
            f"publish: no runs to publish ({output} holds none)", hint="pass run folders, or folders that hold them"
        )
    digests = sorted(held.values(), key=lambda d: d.run.run_id)
    site = build_site(digests, repo=repo)
    plotly, version = plotly_js()
    files = render_site(site, digests, plotly=plotly, plotly_version=version, title=title, commit_url=commit_url)
    written, same = write_site(output, files)
    size = sum(len(data) for data in files.values())
    stdout.print(
        f"site {output}: {plural(len(digests), 'run')} ({added} new) of "
        f"{plural(len(site.boards), 'config')}, {plural(len(site.cases), 'case')}, "
        f"{len(site.events)} confirmed steps; wrote {len(written)} files, {len(same)} unchanged; "
        f"{format_bytes(size)} in all. Open {output / 'index.html'}",
        markup=False,
    )
    print_warnings([*warnings, *(w for board in site.boards for w in board.history.warnings)])
