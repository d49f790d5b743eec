"""The figure the README and the docs' home page show: time per call against n, recurrent models against attention, the
forward pass beside one decode step, from a real run folder (the built-in default sweep's).

    python scripts/readme_figure.py latest docs/assets/latency-cpu.png      # or a run folder

Reads the run through the Python API (no torch). Each curve is the median with its 95 % interval as a band; cells
that did not run ok are left out, and a cell timed on a busy machine is drawn hollow, as the run's own plots do.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import NullLocator

import attnbench as ab
from attnbench.results.store import resolve_run

# Recurrent models in greens, attention in magenta and blue; the run's models are drawn in its own order.
PALETTE = ("#1b7837", "#7fbf7b", "#c51b7d", "#2166ac", "#e08214", "#542788")
PANELS = (
    ("forward", "forward pass: time per call", "sequence length n"),
    ("decode", "decode: time per new token", "context length n"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run folder of the default sweep (forward and decode rows), or latest")
    parser.add_argument("out", type=Path, help="the PNG to write")
    args = parser.parse_args()

    stored = ab.load_run(resolve_run(args.run))
    df = ab.frame([stored])
    env = stored.run.environment
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=120, constrained_layout=True)
    models = list(dict.fromkeys(df["model"]))  # the config's order, as the run's tables have it
    colours = dict(zip(models, PALETTE * (1 + len(models) // len(PALETTE)), strict=False))
    for ax, (mode, title, xlabel) in zip(axes, PANELS, strict=True):
        rows = df[(df["mode"] == mode) & (df["status"] == "ok")]
        for model in models:
            curve = rows[rows["model"] == model].sort_values("seq_len")
            if curve.empty:
                continue
            colour = colours[model]
            ax.fill_between(curve["seq_len"], curve["ci95_low_ms"], curve["ci95_high_ms"], color=colour, alpha=0.2)
            ax.plot(curve["seq_len"], curve["median_ms"], color=colour, label=model)
            quiet = curve[~curve["contended"].fillna(False).astype(bool)]
            busy = curve[curve["contended"].fillna(False).astype(bool)]
            ax.scatter(quiet["seq_len"], quiet["median_ms"], color=colour, s=18, zorder=3)
            ax.scatter(busy["seq_len"], busy["median_ms"], facecolors="white", edgecolors=colour, s=18, zorder=3)
        ax.set(xscale="log", yscale="log", title=title, xlabel=xlabel, ylabel="ms (median, 95 % CI band)")
        lengths = sorted(rows["seq_len"].unique())
        if lengths:  # tick the lengths that were measured, written out (64, 256, … rather than 10²)
            ax.set_xticks(lengths, [str(n) for n in lengths])
            ax.xaxis.set_minor_locator(NullLocator())
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(frameon=False)
    sizes = ", ".join(
        f"{column} {'/'.join(str(v) for v in sorted(df[column].dropna().unique()))}" for column in ("d_model", "batch")
    )
    fig.suptitle(
        f"{stored.run.run_id} · {env.get('gpu_name') or env.get('cpu_model')} · {env.get('torch_threads')} threads · "
        f"{'/'.join(sorted(df['dtype'].unique()))}, {sizes}",
        fontsize=10,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
