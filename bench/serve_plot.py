#!/usr/bin/env python3
"""Plots a serve-bench concurrency sweep: output tokens/s and inter-token latency against concurrency.

  serve_plot.py [--out FILE.png] [--title TEXT] serve_bench.json...

Input: serve_bench.json files that `attnkit serve-bench` wrote (schema attnkit-serve-bench/1). Their
closed-loop runs (--concurrency) are the points; Poisson runs (--request-rate) are skipped with a
note. Several files are merged (one run per concurrency each, e.g. a sweep run as separate
invocations); files of different conditions (model, platform, backend, prefix caching) are drawn as
separate series, labelled by what differs.

Output: one PNG (default: beside the first input, serve_plot.png) with two panels sharing a
logarithmic concurrency axis: output tokens/s, and ITL p50 and p99 in milliseconds. Needs matplotlib;
without it the script says so and exits with status 2 (the JSON and Markdown reports do not need it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SCHEMA = "attnkit-serve-bench/1"
SERIES_KEYS = ("model_dir", "platform", "backend", "prefix_caching")


def load_points(paths: list[Path]) -> dict[tuple, list[dict]]:
    """Closed-loop runs per series (the conditions that name it), sorted by concurrency."""
    series: dict[tuple, list[dict]] = {}
    for path in paths:
        doc = json.loads(path.read_text())
        if doc.get("schema") != SCHEMA:
            sys.exit(f"serve_plot.py: {path}: schema {doc.get('schema')!r}, expected {SCHEMA!r}")
        cond = doc["conditions"]
        key = tuple(cond.get(k) for k in SERIES_KEYS)
        for run in doc["runs"]:
            concurrency = run["trace"].get("concurrency")
            if concurrency is None:
                print(f"serve_plot.py: {path}: skipping {run['label']} (not a concurrency run)", file=sys.stderr)
                continue
            series.setdefault(key, []).append({
                "concurrency": int(concurrency),
                "output_throughput": float(run["output_throughput"]),
                "itl_p50": float(run["itl_ms"]["p50"]),
                "itl_p99": float(run["itl_ms"]["p99"]),
            })
    for points in series.values():
        points.sort(key=lambda p: p["concurrency"])
    return series


def series_label(key: tuple, keys: list[tuple]) -> str:
    """Names a series by the conditions that differ between the series (all of them if only one)."""
    differing = [i for i in range(len(SERIES_KEYS)) if len({k[i] for k in keys}) > 1] or [1, 2]
    parts = []
    for i in differing:
        name, value = SERIES_KEYS[i], key[i]
        parts.append(f"prefix caching {'on' if value else 'off'}" if name == "prefix_caching" else str(value))
    return ", ".join(parts)


def plot(series: dict[tuple, list[dict]], out: Path, title: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("serve_plot.py: matplotlib is not installed; install it (pip install matplotlib) or run this "
              "where it is, e.g. on the device machine. The serve_bench.json/.md reports do not need it.",
              file=sys.stderr)
        sys.exit(2)
    fig, (tput, itl) = plt.subplots(1, 2, figsize=(11, 4.2))
    keys = list(series)
    for key, points in series.items():
        label = series_label(key, keys)
        xs = [p["concurrency"] for p in points]
        tput.plot(xs, [p["output_throughput"] for p in points], marker="o", label=label)
        line, = itl.plot(xs, [p["itl_p50"] for p in points], marker="o", label=f"{label} p50")
        itl.plot(xs, [p["itl_p99"] for p in points], marker="s", linestyle="--", color=line.get_color(),
                 label=f"{label} p99")
    # Ticks at the measured concurrencies, written plainly (a log axis would print powers of two).
    ticks = sorted({p["concurrency"] for points in series.values() for p in points})
    for ax, ylabel in ((tput, "output tokens/s"), (itl, "inter-token latency, ms")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"serve_plot.py: wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", type=Path, help="serve_bench.json files")
    parser.add_argument("--out", type=Path, help="PNG to write (default: serve_plot.png beside the first input)")
    parser.add_argument("--title", default="attnkit serve-bench", help="figure title")
    args = parser.parse_args()
    series = load_points(args.inputs)
    if not series:
        sys.exit("serve_plot.py: no concurrency runs in the inputs (run serve-bench with --concurrency)")
    plot(series, args.out or args.inputs[0].with_name("serve_plot.png"), args.title)


if __name__ == "__main__":
    main()
