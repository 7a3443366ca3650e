"""bench/report.py and bench/workloads.py on the CPU: the merge of one session's bench JSON files
(ratios to the best, fractions of the session's ceilings, refusals kept with their reasons), the
files it writes, the README section it rewrites, its refusals of inconsistent inputs, and the
workload file (selection, the sizes rates are computed from, the earlier runs' shapes kept).
Small fake JSON inputs; no GPU, no binding, no matplotlib needed."""

import builtins
import json
import os
import sys
from pathlib import Path

import pytest

SOURCE = Path(os.environ.get("ATTNKIT_SOURCE_DIR", Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(SOURCE / "bench"))

import report  # noqa: E402
import workloads as wl  # noqa: E402

GPU = "NVIDIA H200"


def entry(name, kind, median_us, *, status="OK", kv_bytes=1e9, flops=1e12, count=1, q=1, ctx=4095, host=None,
          refusal=None, check="passed", clean=None):
    e = {"name": name, "kind": kind, "status": status, "num_q_heads": 32, "num_kv_heads": 8, "head_size": 128,
         "kv_cache_dtype": "bfloat16", "page_size": 16, "window": None, "shared_prefix": 0,
         "requests": [{"count": count, "query_len": q, "num_computed_tokens": ctx}],
         "kv_bytes_read": kv_bytes, "flops": flops, "median_us": median_us if status == "OK" else None,
         "check": {"result": check}}
    if host is not None:
        e["host_step_us"] = {"median": host}
    if clean is not None:
        e["clean_flush_us"] = {"median": clean}
    if refusal:
        e["refusal"] = {"by": "selector", "reasons": refusal}
        e["error"] = "; ".join(refusal)
    return e


def bench_doc(system, entries, copy=4.0, gemm=800.0, kind="attnkit", gpu=GPU, date="2026-12-02T10:00:00Z"):
    return {"schema": "attnkit-bench/2", "system": system, "system_kind": kind,
            "conditions": {"gpu_name": gpu, "date_utc": date, "attnkit_commit": "abc1234",
                           "compute_capability": "9.0", "kernel_libraries": {"CUDNN": "cuDNN 9.19.0"}},
            "ceilings": {"copy_tb_per_s": copy, "bf16_gemm_tflop_per_s": gemm},
            "config": {"backend": system, "iters": 30, "warmup": 5, "check": True, "graph_mode": "eager",
                       "paged_kv": kind != "peer"},
            "workloads": entries}


def write(tmp_path, name, doc):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


@pytest.fixture
def session_files(tmp_path):
    a = bench_doc("VARLEN", [entry("decode_a", "decode", 200.0, host=30.0, clean=190.0),
                             entry("prefill_b", "prefill", 1000.0, q=4096, ctx=0)], copy=4.0, gemm=800.0)
    b = bench_doc("CUDNN", [entry("decode_a", "decode", 250.0, host=20.0),
                            entry("prefill_b", "prefill", 0, status="REFUSED", q=4096, ctx=0,
                                  refusal=["head_size 128 is fine but page_size 4096 is not supported"])],
                  copy=4.2, gemm=780.0)
    c = bench_doc("torch-sdpa-flash (contiguous KV, no paging)",
                  [entry("decode_a", "decode", 400.0, status="FAILED", check="FAILED"),
                   entry("prefill_b", "prefill", 500.0, q=4096, ctx=0)], copy=4.1, gemm=810.0, kind="peer")
    return [write(tmp_path, "attention_varlen.json", a), write(tmp_path, "attention_cudnn.json", b),
            write(tmp_path, "peer_flash.json", c)]


def rows(session, name):
    w = next(w for w in session["workloads"] if w["name"] == name)
    return {r["system"]: r for r in w["systems"]}


def test_merge_ratios_fractions_and_refusals(session_files):
    session = report.merge(report.load_runs(session_files))
    # The session's ceilings: the highest each process measured.
    assert session["ceilings"]["copy_tb_per_s"] == 4.2
    assert session["ceilings"]["bf16_gemm_tflop_per_s"] == 810.0
    d = rows(session, "decode_a")
    assert d["VARLEN"]["ratio_to_best"] == pytest.approx(1.0) and d["VARLEN"]["best"]
    assert d["CUDNN"]["ratio_to_best"] == pytest.approx(250.0 / 200.0) and not d["CUDNN"]["best"]
    # 1e9 bytes in 200 us = 5000 GB/s; of 4.2 TB/s.
    assert d["VARLEN"]["gb_per_s"] == pytest.approx(5000.0)
    assert d["VARLEN"]["fraction_of_ceiling"] == pytest.approx(5.0 / 4.2)
    # A failed check has no time and no ratio, whatever it measured.
    peer = d["torch-sdpa-flash (contiguous KV, no paging)"]
    assert peer["median_us"] is None and peer["ratio_to_best"] is None and peer["status"] == "FAILED"
    p = rows(session, "prefill_b")
    flash = p["torch-sdpa-flash (contiguous KV, no paging)"]
    assert flash["best"] and p["VARLEN"]["ratio_to_best"] == pytest.approx(2.0)
    assert flash["tflop_per_s"] == pytest.approx(2000.0)  # 1e12 FLOPs in 500 us
    assert flash["fraction_of_ceiling"] == pytest.approx(2000.0 / 810.0) and flash["ceiling"] == "bf16_gemm"
    assert p["CUDNN"]["status"] == "REFUSED" and "page_size 4096" in p["CUDNN"]["reason"]


def test_main_writes_log_files_and_the_readme_section(session_files, tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n## Performance\n\n<!-- perf:begin -->\nstale\n<!-- perf:end -->\n\n## After\nkept\n")
    results = tmp_path / "results"
    rc = report.main([*map(str, session_files), "--tag", "t1", "--results-dir", str(results), "--readme", str(readme),
                      "--no-plots"])
    assert rc == 0
    md = (results / "2026-12-02_t1.md").read_text()
    logged = json.loads((results / "2026-12-02_t1.json").read_text())
    assert logged["schema"] == report.SESSION_SCHEMA and logged["tag"] == "t1"
    assert "### decode_a (decode)" in md and "### prefill_b (prefill)" in md
    assert "REFUSED" in md and "page_size 4096 is not supported" in md
    assert "| VARLEN (best) | OK | 200.0 | 190.0 | 5000 |" in md  # the clean-flush median beside the median
    assert "| CUDNN | OK | 250.0 | - | 4000 |" in md  # a run without it
    text = readme.read_text()
    assert "stale" not in text and text.endswith("## After\nkept\n") and text.startswith("# x\n")
    section = text[text.index(report.BEGIN):text.index(report.END)]
    assert "results/2026-12-02_t1.md" in section
    assert "| decode_a | 5000 GB/s (x1.00) | 4000 GB/s (x1.25) | failed |" in section
    # A README copy that goes back into the checkout links the results under a prefix.
    report.main([*map(str, session_files), "--tag", "t2", "--results-dir", str(results), "--readme", str(readme),
                 "--no-plots", "--link-prefix", "bench/results"])
    assert "`bench/results/2026-12-02_t2.md`" in readme.read_text()
    out = capsys.readouterr().out
    assert "decode_a\n  VARLEN: 200.0 us, x1.00\n  CUDNN: 250.0 us, x1.25" in out


def test_readme_without_markers_is_an_error(session_files, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    rc = report.main([*map(str, session_files), "--results-dir", str(tmp_path / "r"), "--readme", str(readme),
                      "--no-plots"])
    assert rc == 2 and readme.read_text() == "# no markers\n"


def test_files_of_different_gpus_or_shapes_are_refused(tmp_path):
    a = write(tmp_path, "a.json", bench_doc("VARLEN", [entry("w", "decode", 1.0)]))
    b = write(tmp_path, "b.json", bench_doc("CUDNN", [entry("w", "decode", 1.0)], gpu="NVIDIA A100"))
    with pytest.raises(report.ReportError, match="different GPUs"):
        report.load_runs([a, b])
    c = write(tmp_path, "c.json", bench_doc("CUDNN", [entry("w", "decode", 1.0, count=2)]))
    with pytest.raises(report.ReportError, match="different shapes"):
        report.merge(report.load_runs([a, c]))
    d = write(tmp_path, "d.json", bench_doc("VARLEN", [entry("w", "decode", 1.0)]))
    with pytest.raises(report.ReportError, match="more than one file"):
        report.load_runs([a, d])


def test_plots_are_skipped_without_matplotlib(session_files, tmp_path, monkeypatch, capsys):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    results = tmp_path / "results"
    rc = report.main([*map(str, session_files), "--results-dir", str(results), "--no-readme"])
    assert rc == 0 and (results / "2026-12-02_session.md").exists()
    assert "plots skipped: matplotlib is not installed" in capsys.readouterr().err
    assert not (results / "plots").exists()


def test_plot_series_from_the_log(session_files, tmp_path):
    results = tmp_path / "results"
    assert report.main([*map(str, session_files), "--tag", "s", "--results-dir", str(results), "--no-readme",
                        "--no-plots"]) == 0
    # A later single run of VARLEN replaces its point; an older one does not.
    newer = bench_doc("VARLEN", [entry("decode_a", "decode", 100.0, host=10.0)], date="2026-12-03T00:00:00Z")
    older = bench_doc("VARLEN", [entry("decode_a", "decode", 900.0)], date="2026-11-01T00:00:00Z")
    write(results, "attention_newer.json", newer)
    write(results, "attention_older.json", older)
    series = report.plot_series(report.logged_points(results, wl.load()))
    decode = series["decode"][1]  # batch 1
    assert decode["VARLEN"] == [(4096, pytest.approx(10000.0))]
    assert decode["CUDNN"] == [(4096, pytest.approx(4000.0))]
    assert "torch-sdpa-flash (contiguous KV, no paging)" not in decode  # its check failed
    assert series["host"]["every context"]["VARLEN"] == [(1, 10.0)]
    assert series["prefill"][1]["torch-sdpa-flash (contiguous KV, no paging)"] == [(4096, pytest.approx(2000.0))]


# ---- the workload file -------------------------------------------------------------------------

def test_the_earlier_runs_workloads_keep_their_shapes():
    table = {w.name: w for w in wl.load()}
    # Names and shapes of the workloads of bench/results/attention_2026-12-01_*.json.
    earlier = {"decode_64x4096": (64, 4096), "decode_128x2048": (128, 2048), "decode_256x1024": (256, 1024),
               "decode_32x16384": (32, 16384), "decode_8x32768": (8, 32768), "decode_16x4096": (16, 4096),
               "decode_1x4096": (1, 4096), "decode_32x4096": (32, 4096)}
    for name, (batch, seq) in earlier.items():
        w = table[name]
        assert w.requests == [(1, seq - 1)] * batch, name
        assert (w.num_q_heads, w.num_kv_heads, w.head_size, w.page_size, w.window, w.shared_prefix) == \
            (32, 8, 128, 16, None, 0), name
    assert table["decode_fp8_64x4096"].kv_dtype == "fp8_e4m3"
    assert table["decode_64x4096_page64"].page_size == 64 and table["decode_64x4096_page4096"].page_size == 4096
    for name, (batch, n) in {"prefill_1x4096": (1, 4096), "prefill_1x16384": (1, 16384),
                             "prefill_16x1024": (16, 1024), "prefill_1x2048": (1, 2048)}.items():
        assert table[name].requests == [(n, 0)] * batch, name
    mixed = table["mixed_32x4096_plus_2048"]
    assert mixed.requests == [(1, 4095)] * 32 + [(2048, 0)]
    assert mixed.parts == ["decode_32x4096", "prefill_1x2048"]
    # And the earlier C++ runs' own KV bytes agree with the sizes computed here.
    logged = json.loads((SOURCE / "bench/results/attention_2026-12-01_varlen_r7.json").read_text())
    for e in logged["workloads"]:
        sh = wl.shape_of(table[e["name"]])
        assert sh.kv_bytes == pytest.approx(e["kv_bytes_read"]), e["name"]
        assert sh.flops == pytest.approx(e["flops"]), e["name"]


def test_every_family_of_the_issue_is_in_the_file():
    table = wl.load()
    assert any(w.kind == "mixed" for w in table)
    assert any(w.shared_prefix for w in table) and any(w.window for w in table)
    assert any(w.kv_dtype.startswith("fp8") for w in table)
    assert {16, 64} <= {w.page_size for w in table}
    assert {1, 4, 8} <= {w.num_q_heads // w.num_kv_heads for w in table}
    assert {64, 128, 256} <= {w.head_size for w in table}
    decode_batches = {w.requests[0][1] + 1 for w in table if w.kind == "decode"}
    assert min(decode_batches) == 512 and max(decode_batches) == 32768
    assert {1, 256} <= {len(w.requests) for w in table if w.kind == "decode"}
    assert {1024, 16384} <= {w.requests[0][0] for w in table if w.kind == "prefill"}
    default = wl.select(table, "default")
    assert 0 < len(default) < len(wl.select(table, "all"))


def test_selection_by_name_brings_parts_and_names_unknown_ones():
    table = wl.load()
    names = [w.name for w in wl.select(table, "mixed_32x4096_plus_2048")]
    assert names == ["decode_32x4096", "prefill_1x2048", "mixed_32x4096_plus_2048"]
    with pytest.raises(wl.WorkloadError, match="unknown workload 'nope'.*allowed: default, all, decode_64x4096"):
        wl.select(table, "decode_64x4096,nope")
    assert all(not w.helper for w in wl.select(table, "all") if w.kind != "mixed" and w.name not in
               ("decode_32x4096", "prefill_1x2048"))


def test_shape_of_window_and_shared_prefix(tmp_path):
    doc = {"workloads": [
        {"name": "win", "kind": "mixed", "num_q_heads": 4, "num_kv_heads": 2, "head_size": 8, "dtype": "bfloat16",
         "kv_dtype": "bfloat16", "page_size": 4, "window": 3, "shared_prefix": 0,
         "requests": [{"count": 1, "query_len": 1, "num_computed_tokens": 9},
                      {"count": 1, "query_len": 4, "num_computed_tokens": 2}]},
        {"name": "pre", "kind": "decode", "num_q_heads": 2, "num_kv_heads": 1, "head_size": 4, "dtype": "bfloat16",
         "kv_dtype": "fp8_e4m3", "page_size": 4, "window": None, "shared_prefix": 8,
         "requests": [{"count": 3, "query_len": 1, "num_computed_tokens": 9}]}]}
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    win, pre = wl.load(path)
    s = wl.shape_of(win)
    # Request 0 (seq 10): its query sees keys 7..9 (3). Request 1 (seq 6): queries at 2..5 see keys 0..5, all 6.
    assert s.kv_bytes == (3 + 6) * 2 * 8 * 2 * 2
    # Pairs: 3 + min(3, 3) + min(3, 4) + 3 + 3 = 15.
    assert s.flops == 4 * 8 * 4 * 15
    assert (s.num_blocks, s.max_pages, s.tokens) == (3 + 2, 3, 5)
    p = wl.shape_of(pre)
    # 3 requests of seq 10: the 8 prefix tokens once, then 2 own tokens each.
    assert p.kv_bytes == (8 + 3 * 2) * 1 * 4 * 2 * 1
    assert p.num_blocks == 2 + 3 * 1 and p.flops == 4 * 4 * 2 * 30
    doc["workloads"][1]["shared_prefix"] = 6
    path.write_text(json.dumps(doc))
    with pytest.raises(wl.WorkloadError, match="shared_prefix"):
        wl.load(path)


def _bench_binary():
    """The C++ bench of this build tree (<build>/bench/attnkit_attention_bench beside <build>/python on
    PYTHONPATH), or ATTNKIT_BENCH_BINARY. It exists in CUDA builds only."""
    if os.environ.get("ATTNKIT_BENCH_BINARY"):
        return Path(os.environ["ATTNKIT_BENCH_BINARY"])
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        candidate = Path(entry).parent / "bench" / "attnkit_attention_bench"
        if entry and candidate.is_file():
            return candidate
    return None


def test_the_cpp_bench_sizes_every_workload_as_python_does():
    import subprocess

    binary = _bench_binary()
    if binary is None:
        pytest.skip("no attnkit_attention_bench in this build (a CUDA build has one; ATTNKIT_BENCH_BINARY names one)")
    listed = json.loads(subprocess.run([str(binary), "--list", "--workloads", "all", "--workload-file",
                                        str(SOURCE / "bench/workloads.json")],
                                       check=True, capture_output=True, text=True).stdout)
    table = {w.name: w for w in wl.load()}
    assert {e["name"] for e in listed} == set(table)
    for e in listed:
        sh = wl.shape_of(table[e["name"]])
        assert (e["num_reqs"], e["num_tokens"], e["max_seq_len"], e["num_kv_blocks"], e["max_pages"]) == \
            (sh.num_reqs, sh.tokens, sh.max_seq, sh.num_blocks, sh.max_pages), e["name"]
        assert e["kv_bytes_read"] == pytest.approx(sh.kv_bytes), e["name"]
        assert e["flops"] == pytest.approx(sh.flops), e["name"]
