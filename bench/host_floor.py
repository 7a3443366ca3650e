#!/usr/bin/env python3
"""The host path against the GPU time it must hide under: each case of attnkit_host_bench's JSON
quoted as a fraction of the GPU floor of the step it prepares, from the card's ceilings measured in
the same run.

The host bench times prepare_step for decode batches (one new token per request) on a small model
(its KV never moves); the floor is that of the step bench's model (docs/design.md cost model):
32 layers of 32 query / 8 KV heads of 128, bf16 KV. Per layer the step reads each request's keys and
values once, kv_tokens x 8 x 128 x 2 x 2 bytes, and does 4 x 128 x 32 x kv_tokens FLOPs (one query
row per request); its floor is the larger of bytes / copy bandwidth and FLOPs / bf16 matrix rate
(decode: the bandwidth term). host / floor below 1 means the next step's host path can hide under
this step's GPU work even when every layer runs at the card's limit.

Ceilings: the JSON context's copy_tb_per_s and bf16_gemm_tflop_per_s (the host bench measures them
when a GPU is present), or --copy-tbps / --gemm-tflops with the source named by --ceilings-from.
kv_tokens: each case's counter, or --kv-tokens-from another host-bench JSON of the same cases (the
steps are deterministic: same requests, groups and context kind, same tokens)."""

from __future__ import annotations

import argparse
import json
import sys

LAYERS, Q_HEADS, KV_HEADS, HEAD_SIZE, KV_ELEMENT_BYTES = 32, 32, 8, 128, 2


def case_key(bench):
    return (int(bench["reqs"]), int(bench["kv_groups"]), int(bench["short_context"]))


def step_floor_us(kv_tokens, copy_tbps, gemm_tflops):
    """The GPU floor of one step of the reference model: (per layer) max(bytes / copy, FLOPs / matrix)."""
    kv_bytes = kv_tokens * KV_HEADS * HEAD_SIZE * 2 * KV_ELEMENT_BYTES
    flops = 4.0 * HEAD_SIZE * Q_HEADS * kv_tokens
    per_layer_us = max(kv_bytes / (copy_tbps * 1e12), flops / (gemm_tflops * 1e12)) * 1e6
    return LAYERS * per_layer_us, kv_bytes


def rows(report, copy_tbps, gemm_tflops, kv_tokens_by_case):
    out = []
    for b in report["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        if b.get("error_occurred"):  # a configuration the backend refused: no counters, no time
            out.append((b["name"], None, None, None, None, b.get("error_message", "error")))
            continue
        tokens = b.get("kv_tokens", kv_tokens_by_case.get(case_key(b)) if "reqs" in b else None)
        if tokens is None:
            out.append((b["name"], None, None, None, None, "no kv_tokens for this case"))
            continue
        assert b["time_unit"] == "us", b["time_unit"]
        floor_us, kv_bytes = step_floor_us(tokens, copy_tbps, gemm_tflops)
        out.append((b["name"], b["real_time"], kv_bytes, floor_us, b["real_time"] / floor_us, ""))
    return out


def markdown(report, copy_tbps, gemm_tflops, source, kv_tokens_by_case):
    lines = [
        "# Host path per step against the GPU floor of the step",
        "",
        f"Host bench run: {report['context'].get('date', '?')}; ceilings: copy {copy_tbps:.3f} TB/s, bf16 matrix "
        f"{gemm_tflops:.1f} TFLOP/s ({source}). Floor: one decode step of {LAYERS} layers of {Q_HEADS}/{KV_HEADS} "
        f"heads of {HEAD_SIZE}, bf16 KV, every layer at the copy bandwidth (the matrix term is smaller for decode); "
        "KV MB per layer = 1e6 bytes. host / floor < 1: the host path hides under the GPU time.",
        "",
        "| case | host us / step | KV MB / layer | GPU floor us / step | host / floor |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, host, kv_bytes, floor_us, fraction, error in rows(report, copy_tbps, gemm_tflops, kv_tokens_by_case):
        if host is None:
            lines.append(f"| {name} | error: {error.splitlines()[0][:120] if error else '-'} | - | - | - |")
        else:
            lines.append(f"| {name} | {host:.1f} | {kv_bytes / 1e6:.1f} | {floor_us:.1f} | {fraction:.4f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("host_bench_json")
    ap.add_argument("--copy-tbps", type=float, help="when the JSON has no measured ceilings")
    ap.add_argument("--gemm-tflops", type=float)
    ap.add_argument("--ceilings-from", default=None, help="where --copy-tbps/--gemm-tflops were measured")
    ap.add_argument("--kv-tokens-from", default=None, help="a host-bench JSON of the same cases with kv_tokens")
    ap.add_argument("--out", default="-")
    a = ap.parse_args(argv)
    report = json.load(open(a.host_bench_json))
    ctx = report.get("context", {})
    if "copy_tb_per_s" in ctx:
        copy_tbps, gemm_tflops = float(ctx["copy_tb_per_s"]), float(ctx["bf16_gemm_tflop_per_s"])
        source = "measured in the same run"
    elif a.copy_tbps and a.gemm_tflops and a.ceilings_from:
        copy_tbps, gemm_tflops, source = a.copy_tbps, a.gemm_tflops, a.ceilings_from
    else:
        ap.error("the JSON has no measured ceilings: give --copy-tbps, --gemm-tflops and --ceilings-from")
    kv_tokens_by_case = {}
    if a.kv_tokens_from:
        for b in json.load(open(a.kv_tokens_from))["benchmarks"]:
            if "kv_tokens" in b:
                kv_tokens_by_case[case_key(b)] = b["kv_tokens"]
    text = markdown(report, copy_tbps, gemm_tflops, source, kv_tokens_by_case)
    if a.out == "-":
        sys.stdout.write(text)
    else:
        open(a.out, "w").write(text)


if __name__ == "__main__":
    main()
