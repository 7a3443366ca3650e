#!/usr/bin/env python3
"""Merges the JSON files of one benchmark session into one report, logs it, plots the log.

  report.py [--tag TAG] [--date YYYY-MM-DD] [--results-dir DIR] [--readme FILE | --no-readme]
            [--no-plots] FILE.json...

Inputs: what one device session wrote: bench/attention_bench.cc's attention_bench.json, one per
attnkit backend, and bench/peers.py's peer_<system>.json. They must come from one GPU (the same
gpu_name), and a workload name must have the same shape in every file.

Per workload: one Markdown table, one row per system: status, median time, GB/s of KV read,
TFLOP/s, the fraction of the session's measured ceiling (the highest copy bandwidth and bf16 matrix
rate any of the session's processes measured; decode and mixed against copy, prefill against the
matrix rate), the ratio of its median time to the best valid one (1.00 = best), and the check.
Refused, failed and errored systems are rows with their reason; they have no ratio.

Writes DIR/<date>_<tag>.md and DIR/<date>_<tag>.json (DIR: --results-dir, default bench/results),
prints per workload each system with its ratio to the best, rewrites the README's performance
section between <!-- perf:begin --> and <!-- perf:end -->, and regenerates the PNG plots under
DIR/plots/ from every logged run in DIR (matplotlib; without it the plots are skipped with a
message and everything else is still written).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads as wl  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- perf:begin -->", "<!-- perf:end -->"
SESSION_SCHEMA = "attnkit-session/1"
PLOTS = {
    "decode": "decode_gbps_vs_context.png",
    "prefill": "prefill_tflops_vs_seqlen.png",
    "host": "host_us_vs_batch.png",
}


class ReportError(ValueError):
    pass


# ---- reading -----------------------------------------------------------------------------------

def system_of(doc):
    """The system a bench JSON measured: 'system' (schema 2), else the C++ bench's backend."""
    return doc.get("system") or doc.get("config", {}).get("backend") or "unknown"


def load_runs(paths):
    runs = []
    for p in paths:
        try:
            doc = json.loads(Path(p).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ReportError(f"{p}: {e}") from None
        if not isinstance(doc, dict) or "workloads" not in doc or "ceilings" not in doc:
            raise ReportError(f"{p}: not a bench JSON (no 'workloads' and 'ceilings')")
        runs.append((str(p), doc))
    if not runs:
        raise ReportError("no input files")
    gpus = {doc.get("conditions", {}).get("gpu_name") for _, doc in runs}
    if len(gpus) > 1:
        raise ReportError(f"the files come from different GPUs ({', '.join(sorted(map(str, gpus)))}): "
                          "one report is one session on one GPU")
    systems = [system_of(doc) for _, doc in runs]
    dup = {s for s in systems if systems.count(s) > 1}
    if dup:
        raise ReportError(f"system {sorted(dup)[0]!r} appears in more than one file")
    return runs


SHAPE_KEYS = ("kind", "num_q_heads", "num_kv_heads", "head_size", "kv_cache_dtype", "page_size", "window",
              "shared_prefix", "requests")


def has_shape(entry):
    """Schema-2 entries carry their full shape; older C++ files name it only."""
    return "requests" in entry and "num_q_heads" in entry


def shape_key(entry):
    return json.dumps({k: entry.get(k) for k in SHAPE_KEYS if k in entry}, sort_keys=True)


# ---- merging -----------------------------------------------------------------------------------

def merge(runs):
    """The session: its ceilings, its systems and, per workload in first-seen order, one row per system."""
    copy = max(doc["ceilings"]["copy_tb_per_s"] for _, doc in runs)
    gemm = max(doc["ceilings"]["bf16_gemm_tflop_per_s"] for _, doc in runs)
    order, rows, shapes = [], {}, {}
    for path, doc in runs:
        system = system_of(doc)
        for e in doc["workloads"]:
            name = e["name"]
            key = shape_key(e)
            if name not in rows:
                order.append(name)
                rows[name] = []
                shapes[name] = (key, path, e)
            elif shapes[name][0] != key and has_shape(e) and has_shape(shapes[name][2]):
                raise ReportError(f"workload {name}: different shapes in {shapes[name][1]} and {path}")
            rows[name].append(row_of(system, doc, e, copy, gemm))
    for name in order:
        valid = [r for r in rows[name] if r["median_us"] is not None]
        best = min((r["median_us"] for r in valid), default=None)
        for r in rows[name]:
            r["ratio_to_best"] = r["median_us"] / best if r["median_us"] is not None and best else None
            r["best"] = r["median_us"] is not None and r["median_us"] == best
    workloads = []
    for name in order:
        e = shapes[name][2]
        workloads.append({"name": name, "kind": e.get("kind"),
                          "shape": {k: e.get(k) for k in SHAPE_KEYS if k in e},
                          "num_reqs": e.get("num_reqs"), "num_tokens": e.get("num_tokens"),
                          "kv_bytes_read": e.get("kv_bytes_read"), "flops": e.get("flops"),
                          "systems": rows[name]})
    return {"schema": SESSION_SCHEMA,
            "ceilings": {"copy_tb_per_s": copy, "bf16_gemm_tflop_per_s": gemm,
                         "rule": "the highest value any process of the session measured",
                         "per_file": {system_of(doc): {"copy_tb_per_s": doc["ceilings"]["copy_tb_per_s"],
                                                       "bf16_gemm_tflop_per_s": doc["ceilings"]["bf16_gemm_tflop_per_s"]}
                                      for _, doc in runs}},
            "systems": [{"system": system_of(doc), "kind": doc.get("system_kind", "attnkit"), "file": path,
                         "config": doc.get("config", {}), "conditions": doc.get("conditions", {})}
                        for path, doc in runs],
            "workloads": workloads}


def row_of(system, doc, e, copy, gemm):
    status = e.get("status", "?")
    ok = status == "OK" and e.get("median_us") is not None
    median = e["median_us"] if ok else None
    kind = e.get("kind")
    row = {"system": system, "status": status, "median_us": median, "gb_per_s": None, "tflop_per_s": None,
           "fraction_of_ceiling": None, "ceiling": "bf16_gemm" if kind == "prefill" else "copy",
           "check": (e.get("check") or {}).get("result"), "host_step_us": (e.get("host_step_us") or {}).get("median"),
           "clean_flush_us": (e.get("clean_flush_us") or {}).get("median") if ok else None,
           "reason": None, "notes": e.get("notes") or ""}
    if ok:
        seconds = median * 1e-6
        if e.get("kv_bytes_read"):
            row["gb_per_s"] = e["kv_bytes_read"] / seconds / 1e9
        if e.get("flops"):
            row["tflop_per_s"] = e["flops"] / seconds / 1e12
        if kind == "prefill":
            row["fraction_of_ceiling"] = (row["tflop_per_s"] or 0) / gemm
        else:
            row["fraction_of_ceiling"] = (row["gb_per_s"] or 0) / 1e3 / copy
    else:
        reasons = (e.get("refusal") or {}).get("reasons")
        row["reason"] = "; ".join(reasons) if reasons else (e.get("error") or (e.get("check") or {}).get("result")
                                                              or "no time")
    return row


# ---- writing -----------------------------------------------------------------------------------

def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def cell(text):
    return str(text).replace("|", "/").replace("\n", " ")


def conditions_block(session):
    first = next((s for s in session["systems"] if s["kind"] != "peer"), session["systems"][0])
    c = first["conditions"]
    peer = next((s["conditions"] for s in session["systems"] if s["kind"] == "peer"), {})
    libs = {}
    for s in session["systems"]:
        libs.update(s["conditions"].get("kernel_libraries") or {})
    lines = [
        f"date (UTC):        {c.get('date_utc', '?')}",
        f"attnkit commit:    {c.get('attnkit_commit', '?')}",
        f"GPU:               {c.get('gpu_name', '?')}, compute capability {c.get('compute_capability', '?')}, "
        f"{c.get('sm_count', '?')} SMs",
        f"driver (CUDA API): {c.get('driver_version', '?')}",
        f"CUDA runtime:      {c.get('runtime_version', '?')}",
        f"cuBLAS:            {c.get('cublas_version', '?')}",
        f"cuDNN (loaded):    {c.get('cudnn_runtime_version', '?')}",
        f"kernel libraries:  {'; '.join(f'{k}: {v}' for k, v in libs.items()) or 'none'}",
    ]
    if peer:
        lines.append(f"torch:             {peer.get('torch_version', '?')} ({peer.get('runtime_version', '?')}, "
                     f"cuDNN {peer.get('cudnn_runtime_version', '?')}), Python {peer.get('python_version', '?')}")
    lines.append("graph mode:        " + ", ".join(sorted({str(s["config"].get("graph_mode", "eager"))
                                                          for s in session["systems"]})))
    return "\n".join(lines)


def system_lines(session):
    out = []
    for s in session["systems"]:
        cfg = s["config"]
        paged = cfg.get("paged_kv", s["kind"] != "peer")
        check = cfg.get("check", "?")
        if isinstance(check, bool):  # the C++ bench: against GPU_REFERENCE unless --no-check
            check = "against GPU_REFERENCE" if check else "off (--no-check)"
        out.append(f"- {s['system']}: {'attnkit backend' if s['kind'] != 'peer' else 'peer'}, "
                   f"{'paged KV' if paged else 'contiguous KV (no paging)'}, {cfg.get('iters', '?')} timed / "
                   f"{cfg.get('warmup', '?')} warm-up calls, check {check}, "
                   f"from `{Path(s['file']).name}`")
    return out


def workload_title(w):
    sh = w["shape"]
    bits = []
    if sh.get("requests"):
        bits.append(" + ".join(f"{g['count']} x (q {g['query_len']}, ctx {g['num_computed_tokens']})"
                               for g in sh["requests"]))
    if "num_q_heads" in sh:
        bits.append(f"{sh['num_q_heads']}/{sh['num_kv_heads']} heads of {sh['head_size']}")
    if "kv_cache_dtype" in sh:
        bits.append(f"KV {sh['kv_cache_dtype']}")
    if "page_size" in sh:
        bits.append(f"page {sh['page_size']}")
    if sh.get("window"):
        bits.append(f"window {sh['window']}")
    if sh.get("shared_prefix"):
        bits.append(f"shared prefix {sh['shared_prefix']}")
    return f"### {w['name']} ({w['kind']})\n\n{', '.join(bits)}\n" if bits else f"### {w['name']} ({w['kind']})\n"


def workload_table(w):
    lines = ["| system | status | median us | clean-flush us | GB/s | TFLOP/s | of ceiling | x best | host us/step | "
             "check / reason |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in sorted(w["systems"], key=lambda r: (r["median_us"] is None, r["median_us"] or 0)):
        frac = None if r["fraction_of_ceiling"] is None else 100 * r["fraction_of_ceiling"]
        tail = (r["check"] or "") if r["median_us"] is not None else (r["reason"] or "")
        if r["notes"]:
            tail = f"{tail}; {r['notes']}" if tail else r["notes"]
        lines.append(f"| {cell(r['system'])}{' (best)' if r['best'] else ''} | {r['status']} | "
                     f"{fmt(r['median_us'], '.1f')} | {fmt(r.get('clean_flush_us'), '.1f')} | {fmt(r['gb_per_s'], '.0f')} | {fmt(r['tflop_per_s'], '.1f')} | "
                     f"{fmt(frac, '.1f')}{'%' if frac is not None else ''} ({r['ceiling']}) | "
                     f"{fmt(r['ratio_to_best'], '.2f')} | {fmt(r['host_step_us'], '.1f')} | {cell(tail)} |")
    return "\n".join(lines) + "\n"


def session_markdown(session, title):
    c = session["ceilings"]
    md = [f"# {title}\n", "Conditions:\n", "```", conditions_block(session), "```\n",
          "Ceilings (measured in this session; the fractions use the highest of each):\n",
          f"- copy bandwidth: {c['copy_tb_per_s']:.3f} TB/s; bf16 matrix rate: {c['bf16_gemm_tflop_per_s']:.1f} TFLOP/s",
          *[f"  - {s}: copy {v['copy_tb_per_s']:.3f} TB/s, matrix {v['bf16_gemm_tflop_per_s']:.1f} TFLOP/s"
            for s, v in c["per_file"].items()],
          "", "Systems:\n", *system_lines(session), "",
          "Per workload: median of per-call CUDA-event times with the L2 flushed before each call; GB/s = KV bytes "
          "the step must read / median; TFLOP/s = 4 x head size x q heads x visible (query, key) pairs / median; "
          "'x best' = median / the best valid median of the workload. A time counts only when the system's "
          "output passed the check against GPU_REFERENCE on the same inputs.\n"]
    for w in session["workloads"]:
        md.append(workload_title(w))
        md.append(workload_table(w))
    return "\n".join(md)


def summary_table(session):
    """One row per workload, one column per system: the rate and the ratio to the best."""
    systems = [s["system"] for s in session["systems"]]
    lines = ["| workload | " + " | ".join(cell(s) for s in systems) + " |",
             "| --- |" + " ---: |" * len(systems)]
    for w in session["workloads"]:
        by = {r["system"]: r for r in w["systems"]}
        cells = []
        for s in systems:
            r = by.get(s)
            if r is None:
                cells.append("")
            elif r["median_us"] is None:
                cells.append(r["status"].lower())
            else:
                rate = (f"{r['tflop_per_s']:.0f} TFLOP/s" if w["kind"] == "prefill" else f"{r['gb_per_s']:.0f} GB/s")
                cells.append(f"{rate} (x{r['ratio_to_best']:.2f})")
        lines.append(f"| {w['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def console_lines(session):
    out = []
    for w in session["workloads"]:
        out.append(w["name"])
        for r in sorted(w["systems"], key=lambda r: (r["median_us"] is None, r["median_us"] or 0)):
            if r["median_us"] is None:
                out.append(f"  {r['system']}: {r['status']} ({r['reason']})")
            else:
                out.append(f"  {r['system']}: {r['median_us']:.1f} us, x{r['ratio_to_best']:.2f}")
    return out


def rewrite_readme(readme: Path, session, log_md: Path, plots, link_prefix=None, results_dir=None):
    text = readme.read_text()
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ReportError(f"{readme}: needs exactly one {BEGIN} ... {END} section")
    c = session["ceilings"]
    first = next((s for s in session["systems"] if s["kind"] != "peer"), session["systems"][0])
    cond = first["conditions"]
    def rel(p):
        """The link to a results file: under link_prefix when given (the README is a copy that goes
        back into the checkout), else relative to the README."""
        p = Path(p).resolve()
        if link_prefix is not None:
            return f"{link_prefix.rstrip('/')}/{p.relative_to(Path(results_dir).resolve()).as_posix()}"
        base = readme.resolve().parent
        return p.relative_to(base).as_posix() if p.is_relative_to(base) else str(p)
    body = [BEGIN,
            f"Latest session: `{rel(log_md)}` ({cond.get('gpu_name', '?')}, {cond.get('date_utc', '?')}, attnkit "
            f"{cond.get('attnkit_commit', '?')}); measured ceilings {c['copy_tb_per_s']:.2f} TB/s copy, "
            f"{c['bf16_gemm_tflop_per_s']:.0f} TFLOP/s bf16. Each cell: the rate (GB/s of KV read, or TFLOP/s "
            "for prefill) and the time relative to the best system (x1.00 = best); refused/failed systems are "
            "named as such. Per-workload tables with conditions and reasons are in the log file.",
            "", summary_table(session)]
    if plots:
        body += ["Plots (from every logged run under `bench/results/`, regenerated by `bench/report.py`):", ""]
        body += [f"![{Path(p).stem}]({rel(p)})" for p in plots]
        body.append("")
    body.append(END)
    start, end = text.index(BEGIN), text.index(END) + len(END)
    readme.write_text(text[:start] + "\n".join(body) + text[end:])


# ---- plots from the log ------------------------------------------------------------------------

def logged_points(results_dir: Path, table):
    """(system, entry with its shape) for every valid workload of every logged run: merged sessions and
    single bench runs; for a (system, workload) the latest date wins. Older files without shapes take
    them from the workload file (same names, same shapes)."""
    by_name = {w.name: w for w in table}
    latest = {}
    for p in sorted(results_dir.glob("*.json")):
        try:
            doc = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(doc, dict):
            continue
        entries = []
        if doc.get("schema") == SESSION_SCHEMA:
            for w in doc["workloads"]:
                for r in w["systems"]:
                    if r["median_us"] is not None:
                        date = next((s["conditions"].get("date_utc", "") for s in doc["systems"]
                                     if s["system"] == r["system"]), "")
                        entries.append((r["system"], w["name"], date, r, w["shape"]))
        elif "workloads" in doc and "ceilings" in doc:
            system = system_of(doc)
            date = doc.get("conditions", {}).get("date_utc", "")
            for e in doc["workloads"]:
                if e.get("status") == "OK" and e.get("median_us") is not None:
                    secs = e["median_us"] * 1e-6
                    r = {"median_us": e["median_us"], "host_step_us": (e.get("host_step_us") or {}).get("median"),
                         "gb_per_s": e["kv_bytes_read"] / secs / 1e9 if e.get("kv_bytes_read") else None,
                         "tflop_per_s": e["flops"] / secs / 1e12 if e.get("flops") else None}
                    entries.append((system, e["name"], date, r, {k: e.get(k) for k in SHAPE_KEYS if k in e}))
        for system, name, date, r, shape in entries:
            if not shape.get("requests") and name in by_name:
                shape = by_name[name].to_json()
                shape["kv_cache_dtype"] = shape["kv_dtype"]
            key = (system, name)
            if key not in latest or latest[key][0] <= date:
                latest[key] = (date, r, shape)
    return [(system, name, r, shape) for (system, name), (_, r, shape) in latest.items()]


def plain(shape, kind):
    """The base family: bf16 KV, page 16, 32/8 heads of 128, no window, no prefix, one request group."""
    return (shape.get("kind", kind) == kind and shape.get("kv_cache_dtype", "bfloat16") == "bfloat16"
            and shape.get("page_size") == 16 and shape.get("num_q_heads") == 32 and shape.get("num_kv_heads") == 8
            and shape.get("head_size") == 128 and not shape.get("window") and not shape.get("shared_prefix")
            and len(shape.get("requests") or []) == 1)


def plot_series(points):
    """Series for the three plots: {plot: {group: {system: [(x, y)]}}}."""
    series = {"decode": {}, "prefill": {}, "host": {}}
    for system, name, r, shape in points:
        if plain(shape, "decode"):
            g = shape["requests"][0]
            batch, ctx = g["count"], g["num_computed_tokens"] + 1
            if r.get("gb_per_s"):
                series["decode"].setdefault(batch, {}).setdefault(system, []).append((ctx, r["gb_per_s"]))
            if r.get("host_step_us"):  # one panel: the host path's cost grows with requests (and pages)
                series["host"].setdefault("every context", {}).setdefault(system, []).append((batch, r["host_step_us"]))
        elif plain(shape, "prefill"):
            g = shape["requests"][0]
            if g["count"] == 1 and g["num_computed_tokens"] == 0 and r.get("tflop_per_s"):
                series["prefill"].setdefault(1, {}).setdefault(system, []).append((g["query_len"], r["tflop_per_s"]))
    for plot in series.values():
        for group in plot.values():
            for system in group:
                group[system] = sorted(set(group[system]))
    return series


def make_plots(results_dir: Path, table, log_dirs=()):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report.py: plots skipped: matplotlib is not installed (the tables and the README do not need it; "
              "run report.py where matplotlib is, e.g. on the device machine)", file=sys.stderr)
        return []
    points = {}
    for d in (*log_dirs, results_dir):  # a later folder's point for the same (system, workload) wins
        for system, name, r, shape in logged_points(Path(d), table):
            points[(system, name)] = (system, name, r, shape)
    series = plot_series(list(points.values()))
    out_dir = results_dir / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    specs = {"decode": ("context length (tokens)", "KV read (GB/s)", "batch {}", True),
             "prefill": ("sequence length (tokens)", "TFLOP/s", "causal prefill, batch {}", True),
             "host": ("batch size (requests)", "host us per step (prepare_step)", "decode workloads, {}", True)}
    for plot, groups in series.items():
        if not groups:
            continue
        xlabel, ylabel, title, logx = specs[plot]
        keys = sorted(groups, key=str)
        cols = min(3, len(keys))
        rows = math.ceil(len(keys) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
        for ax in axes.flat[len(keys):]:
            ax.set_visible(False)
        for ax, key in zip(axes.flat, keys):
            for system, pts in sorted(groups[key].items()):
                # Host points of different contexts share a batch size: markers only, no line.
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=system,
                        linestyle="none" if plot == "host" else "-")
            if logx:
                ax.set_xscale("log", base=2)
            ax.set_title(title.format(key))
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / PLOTS[plot]
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


# ---- main --------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="attention_bench.json / peer_*.json of one session")
    ap.add_argument("--tag", default="session")
    ap.add_argument("--date", default=None, help="YYYY-MM-DD (default: the session's date)")
    ap.add_argument("--results-dir", default=str(REPO / "bench" / "results"))
    ap.add_argument("--readme", default=str(REPO / "README.md"))
    ap.add_argument("--no-readme", action="store_true")
    ap.add_argument("--link-prefix", default=None,
                    help="the README links results as PREFIX/<file> (e.g. bench/results when the README and "
                         "the results are copies that go back into the checkout)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--log-dir", action="append", default=[],
                    help="more folders of logged runs for the plots (e.g. the checkout's bench/results when "
                         "--results-dir is a scratch folder); repeatable")
    ap.add_argument("--workload-file", default=str(wl.DEFAULT_FILE))
    args = ap.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9._-]+", args.tag):
        ap.error(f"--tag {args.tag!r}: letters, digits, '.', '_' and '-' only")
    try:
        runs = load_runs(args.files)
        session = merge(runs)
        date = args.date
        if date is None:
            stamp = next((d["conditions"].get("date_utc") for _, d in runs if d.get("conditions", {}).get("date_utc")),
                         None)
            date = stamp[:10] if stamp else datetime.date.today().isoformat()
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
            raise ReportError(f"--date {date!r}: expected YYYY-MM-DD")
        results = Path(args.results_dir)
        results.mkdir(parents=True, exist_ok=True)
        stem = results / f"{date}_{args.tag}"
        session["tag"], session["date"] = args.tag, date
        md_path, json_path = stem.with_suffix(".md"), stem.with_suffix(".json")
        md_path.write_text(session_markdown(session, f"attnkit benchmark session {date} {args.tag}"))
        json_path.write_text(json.dumps(session, indent=1) + "\n")
        print("\n".join(console_lines(session)))
        print(f"wrote {md_path} and {json_path}", file=sys.stderr)
        if not args.no_plots:
            try:
                for p in make_plots(results, wl.load(args.workload_file), args.log_dir):
                    print(f"wrote {p}", file=sys.stderr)
            except Exception as e:  # noqa: BLE001  (the plots are optional; the tables and README are not)
                print(f"report.py: plots failed: {type(e).__name__}: {e}", file=sys.stderr)
        # The README names the plots that exist (written now or by an earlier run with matplotlib).
        plots = [results / "plots" / name for name in PLOTS.values() if (results / "plots" / name).exists()]
        if not args.no_readme:
            rewrite_readme(Path(args.readme), session, md_path, plots, args.link_prefix, results)
            print(f"rewrote the performance section of {args.readme}", file=sys.stderr)
    except (ReportError, wl.WorkloadError) as e:
        print(f"report.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
