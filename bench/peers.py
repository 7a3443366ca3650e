#!/usr/bin/env python3
"""The Python peers of attnkit's attention backends, timed on the workloads of bench/workloads.json.

Per workload that a peer can express, the same shapes and the same numbers as
bench/attention_bench.cc (bench_inputs.py, which computes bench_inputs.h's streams on the GPU): the
queries and every request's keys/values (bf16, uniform in [-1, 1]; a shared prefix is the same
keys/values in every request). attnkit's GPU_REFERENCE backend, through the binding, runs the step
on those inputs (context keys/values written into its paged cache through the C++ bench's block
table, a permutation of the blocks, the step's own keys/values through runner.attention); each
peer's output must match it within bf16 tolerance (the C++ bench's check: |diff| <= 2e-2 + 2e-2 |ref| per element and RMS(diff) <= 0.02 RMS(ref)) before its time
counts. Timing: warm-up calls first (FlexAttention's compilation happens there), then per call an
L2 flush (a 512 MiB memset, outside the timed region) and a pair of CUDA events; the median of
--iters calls; then the same with a flush that reads the 512 MiB instead (clean_flush_us: no dirty
lines left for the timed call to write back).

Peers:
  torch-sdpa-flash   torch.nn.functional.scaled_dot_product_attention under
                     sdpa_kernel(SDPBackend.FLASH_ATTENTION), contiguous KV [B, H, S, D]: no paging
  torch-sdpa-cudnn   the same under SDPBackend.CUDNN_ATTENTION
  flex-attention     torch.nn.attention.flex_attention (torch.compile'd), contiguous KV with a mask
                     for bottom-right causal, sliding window and (mixed batches) the request
                     boundaries of a packed batch. Not paged: torch's experimental PagedAttention
                     (torch.nn.attention.experimental._paged_attention) requires the block mask's KV
                     block size to equal the page size and keeps its own page table; pages of 16
                     and 64 tokens would need FlexAttention blocks that small, not attempted here.
FlashInfer's own Python wrappers are not run: the flashinfer-python wheel needs apache-tvm-ffi,
cuda-tile, nccl4py and nvidia-cutlass-dsl on the GPU machine, which has no network, and they do not
fit the device tool's transfer limit; attnkit's FLASHINFER backend runs the same kernels.

Each peer writes DIR/peer_<system>.json in the C++ bench's schema (conditions, ceilings measured in
this process: device-to-device copy and bf16 matmul, config, one entry per workload with status OK,
FAILED (check), ERROR or REFUSED (with the reason the peer cannot express it)).

Without torch, a GPU or a CUDA build of attnkit it prints "no GPU: <reason>" and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import json
import math
import os
import platform
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_inputs as bi  # noqa: E402
import workloads as wl  # noqa: E402

FLUSH_BYTES = 512 << 20
COPY_BYTES = 1 << 31
GEMM_N = 8192
CEILING_WARMUP, CEILING_ITERS = 3, 15
TOLERANCE = "2e-2 + 2e-2*|ref| per element; rms_diff <= 0.02*rms_ref"

SYSTEMS = {
    "torch-sdpa-flash": "torch-sdpa-flash (contiguous KV, no paging)",
    "torch-sdpa-cudnn": "torch-sdpa-cudnn (contiguous KV, no paging)",
    "flex-attention": "flex-attention (contiguous KV, no paging)",
}


class Refused(Exception):
    """The peer cannot express the workload; the message says why."""


def no_gpu_reason():
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no GPU"
    try:
        import attnkit
    except ImportError as e:
        return f"the attnkit binding is not importable ({e}); set PYTHONPATH=<build>/python"
    if not attnkit.built_with_cuda:
        return "this build of attnkit has no CUDA sources"
    if not attnkit.cuda_available():
        return f"attnkit sees no usable GPU: {attnkit.probe_gpu()['error']}"
    return None


# ---- statistics, timing ------------------------------------------------------------------------

def stats(samples):
    v = sorted(samples)
    n = len(v)
    median = v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])
    p90 = v[max(math.ceil(0.9 * n), 1) - 1]
    return {"median": median, "min": v[0], "p90": p90, "max": v[-1]}


def time_calls(torch, fn, iters, warmup, flush, clean=False):
    """Microseconds per call: L2 flushed before each (outside the events), CUDA events around it.

    The flush writes the scratch (a fill: the L2 is left full of dirty lines whose write-back the
    timed call pays for, the method of the earlier runs) or, `clean`, reads it (an amax: clean
    lines), as attnkit_attention_bench does both."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    scratch = flush.view(torch.float32)
    for i in range(iters):
        if clean:
            torch.amax(scratch)
        else:
            flush.fill_(0xA5 if i & 1 else 0x5A)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return [1e3 * s.elapsed_time(e) for s, e in zip(starts, ends)]


# ---- conditions and ceilings -------------------------------------------------------------------

def driver_version():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            return f"{v.value // 1000}.{(v.value % 1000) // 10} ({v.value})"
    except OSError:
        pass
    return "unknown"


def conditions(torch, attnkit):
    props = torch.cuda.get_device_properties(0)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    libs = {b["name"]: b["library"] for b in attnkit.backends() if b["library"]}
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "attnkit_commit": os.environ.get("ATTNKIT_COMMIT") or "unknown",
        "gpu_name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "memory_bytes": props.total_memory,
        "driver_version": driver_version(),
        "runtime_version": f"torch CUDA {torch.version.cuda}",
        "torch_version": torch.__version__,
        "cudnn_runtime_version": (f"{cudnn // 10000}.{(cudnn % 10000) // 100}.{cudnn % 100} ({cudnn})"
                                  if cudnn else "not available"),
        "kernel_libraries": libs,
        "python_version": platform.python_version(),
        "host_threads": os.cpu_count(),
    }


def measure_ceilings(torch):
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda").fill_(0x3C)
    dst = torch.empty_like(src)
    copy_ms = []
    for i in range(CEILING_WARMUP + CEILING_ITERS):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        e.synchronize()
        if i >= CEILING_WARMUP:
            copy_ms.append(s.elapsed_time(e))
    del src, dst
    g = torch.Generator(device="cuda").manual_seed(0xA11CE)
    a = (torch.rand(GEMM_N, GEMM_N, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
    b = (torch.rand(GEMM_N, GEMM_N, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
    out = torch.empty_like(a)
    gemm_ms = []
    for i in range(CEILING_WARMUP + CEILING_ITERS):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.matmul(a, b, out=out)
        e.record()
        e.synchronize()
        if i >= CEILING_WARMUP:
            gemm_ms.append(s.elapsed_time(e))
    del a, b, out
    torch.cuda.empty_cache()
    cs, gs = stats(copy_ms), stats(gemm_ms)
    return {"copy_tb_per_s": 2.0 * COPY_BYTES / (cs["median"] * 1e-3) / 1e12, "copy_bytes": COPY_BYTES,
            "copy_ms": cs, "copy_method": "torch Tensor.copy_ device to device, (read + written) / median",
            "bf16_gemm_tflop_per_s": 2.0 * GEMM_N ** 3 / (gs["median"] * 1e-3) / 1e12, "gemm_mnk": GEMM_N,
            "gemm_ms": gs, "gemm_method": "torch.matmul bf16, 2mnk / median", "repetitions": CEILING_ITERS}


# ---- inputs and the reference ------------------------------------------------------------------

class Inputs:
    """One workload's queries and keys/values on the GPU, packed in the scheduler's order:
    q [tokens, q heads, D]; k, v [sum of seq_len, KV heads, D]; request r's rows are
    q[cu_q[r]:cu_q[r+1]] and k[cu_k[r]:cu_k[r+1]] (its last query_len keys are the step's own)."""

    def __init__(self, torch, w):
        self.w = w
        self.reqs = w.requests
        self.uniform = w.uniform
        self._dense = None
        self.q_lens = [q for q, _ in self.reqs]
        self.seq_lens = [q + c for q, c in self.reqs]
        self.cu_q = [0]
        self.cu_k = [0]
        for q, s in zip(self.q_lens, self.seq_lens):
            self.cu_q.append(self.cu_q[-1] + q)
            self.cu_k.append(self.cu_k[-1] + s)
        d, hq, hk = w.head_size, w.num_q_heads, w.num_kv_heads

        def rand(salt, rows, heads):
            # The stream in chunks of rows, so the int64 temporaries stay small.
            out = torch.empty(rows, heads, d, device="cuda", dtype=torch.bfloat16)
            flat = out.view(-1)
            chunk = 1 << 24
            for first in range(0, flat.numel(), chunk):
                index = torch.arange(first, min(first + chunk, flat.numel()), device="cuda", dtype=torch.int64)
                flat[first:first + index.numel()] = bi.uniform(index, bi.seed_of(w.name, salt), -1.0, 1.0,
                                                               lambda a: a.to(torch.float32))
            return out

        self.q = rand(bi.QUERY_SALT, self.cu_q[-1], hq)
        self.k = rand(bi.KEY_SALT, self.cu_k[-1], hk)
        self.v = rand(bi.VALUE_SALT, self.cu_k[-1], hk)
        p = w.shared_prefix
        for r in range(1, len(self.reqs)):
            self.k[self.cu_k[r]:self.cu_k[r] + p] = self.k[:p]
            self.v[self.cu_k[r]:self.cu_k[r] + p] = self.v[:p]

    def dense(self):
        """A uniform batch as dense [B, H, L, D] tensors (contiguous, made once): q, k, v."""
        if self._dense is None:
            b, (q_len, _), s = len(self.reqs), self.reqs[0], self.seq_lens[0]
            w = self.w
            q = self.q.view(b, q_len, w.num_q_heads, w.head_size).transpose(1, 2).contiguous()
            k = self.k.view(b, s, w.num_kv_heads, w.head_size).transpose(1, 2).contiguous()
            v = self.v.view(b, s, w.num_kv_heads, w.head_size).transpose(1, 2).contiguous()
            self._dense = (q, k, v)
        return self._dense

    def from_dense(self, out):
        """[B, H, L, D] back to the packed [tokens, H, D] rows."""
        return out.transpose(1, 2).reshape(self.cu_q[-1], self.w.num_q_heads, self.w.head_size)


class TorchOps:
    """The array operations reference_output needs, on torch CUDA tensors (tests pass NumPy ones)."""

    def __init__(self, torch):
        self.torch = torch

    def index(self, values):
        return self.torch.tensor(values, device="cuda", dtype=self.torch.int64)

    def arange(self, begin, end):
        return self.torch.arange(begin, end, device="cuda")

    def cat(self, arrays):
        return self.torch.cat(arrays)

    def nan_like(self, x):
        return self.torch.full_like(x, float("nan"))

    def empty_like(self, x):
        return self.torch.empty_like(x)

    def kv_cache(self, runner, layer):
        return tuple(self.torch.from_dlpack(x) for x in runner.kv_cache(layer))

    def synchronize(self):
        self.torch.cuda.synchronize()

    def stream(self):
        return self.torch.cuda.current_stream().cuda_stream


def block_tables(w, order, num_blocks, max_pages):
    """The step's block-table rows in the runner's order, as the C++ bench builds them: a permutation
    of the blocks (bench_inputs.block_permutation), a shared prefix's pages the same (the
    permutation's first ones) in every request."""
    perm = bi.block_permutation(bi.seed_of(w.name, bi.BLOCK_SALT), num_blocks)
    prefix_pages = w.shared_prefix // w.page_size
    nxt = prefix_pages
    rows = []
    for frm in order:
        q_len, ctx = w.requests[frm]
        pages = math.ceil((q_len + ctx) / w.page_size)
        row = perm[:min(prefix_pages, pages)]
        row += perm[nxt:nxt + pages - len(row)]
        nxt += pages - min(prefix_pages, pages)
        rows.append(row + [0] * (max_pages - pages))
    return rows


def reference_output(attnkit, w, q, k, v, cu_q, cu_k, ops, *, platform="cuda", backend="GPU_REFERENCE",
                     dtype="bfloat16"):
    """The step on attnkit's reference backend through the binding, on these inputs: q [tokens, q heads,
    D] and k, v [sum of seq_len, KV heads, D] packed per request in the scheduler's order (cu_q, cu_k
    their offsets). Context keys/values go into the runner's paged cache at the block table's pages,
    the step's own through runner.attention. Returns the output rows in the scheduler's order."""
    sh = wl.shape_of(w)
    spec = attnkit.LayerSpec("attn", num_q_heads=w.num_q_heads, num_kv_heads=w.num_kv_heads, head_size=w.head_size,
                             dtype=dtype, kv_cache_dtype=w.kv_dtype if w.kv_dtype != "bfloat16" else dtype,
                             block_size=w.page_size, sliding_window=w.window)
    cfg = attnkit.RunnerConfig(platform=platform, backend=backend, max_num_reqs=sh.num_reqs,
                               max_num_tokens=sh.tokens, max_model_len=sh.max_seq, num_blocks=sh.num_blocks,
                               cascade="never")
    runner = attnkit.ModelRunner([spec], cfg)
    try:
        reqs = w.requests
        step_order = runner.order_requests(list(range(len(reqs))), [q_len for q_len, _ in reqs])
        order = list(step_order)
        rows = block_tables(w, order, sh.num_blocks, sh.max_pages)
        k_cache, v_cache = ops.kv_cache(runner, "attn")
        kernel_page = runner.kv_cache_info("attn")["block_size"]
        per_block = w.page_size // kernel_page
        q_rows, new_rows = [], []
        for frm, row in zip(order, rows):
            q_len, ctx = reqs[frm]
            k0 = cu_k[frm]
            if ctx:
                # Token t of the request: manager block row[t // page], kernel block
                # row[t // page] * per_block + (t % page) // kernel_page, offset t % kernel_page.
                t = list(range(ctx))
                kb = ops.index([row[i // w.page_size] * per_block + (i % w.page_size) // kernel_page for i in t])
                off = ops.index([i % kernel_page for i in t])
                k_cache[kb, off] = k[k0:k0 + ctx]
                v_cache[kb, off] = v[k0:k0 + ctx]
            q_rows.append(ops.arange(cu_q[frm], cu_q[frm + 1]))
            new_rows.append(ops.arange(k0 + ctx, k0 + ctx + q_len))
        q_idx, kv_idx = ops.cat(q_rows), ops.cat(new_rows)
        step_q, step_k, step_v = q[q_idx], k[kv_idx], v[kv_idx]  # advanced indexing: contiguous copies
        out = ops.nan_like(step_q)
        ops.synchronize()
        stream = ops.stream()
        runner.prepare_step(order, [reqs[i][0] for i in order], [reqs[i][1] for i in order], [rows], order=step_order,
                            stream=stream)
        with runner.forward():
            runner.attention("attn", step_q, step_k, step_v, out, stream=stream)
        ops.synchronize()
        packed = ops.empty_like(out)
        packed[q_idx] = out  # back to the scheduler's order
        return packed
    finally:
        runner.close()


def reference(torch, attnkit, inputs):
    """GPU_REFERENCE on a workload's inputs (packed rows, scheduler order)."""
    return reference_output(attnkit, inputs.w, inputs.q, inputs.k, inputs.v, inputs.cu_q, inputs.cu_k,
                            TorchOps(torch))


def compare(torch, got, ref):
    g, r = got.float(), ref.float()
    d = (g - r).abs()
    tol = 2e-2 + 2e-2 * r.abs()
    bad = int((~(d <= tol)).sum())  # NaN fails
    finite = torch.isfinite(d)
    rms_d = float(torch.sqrt((torch.where(finite, d, 0) ** 2).mean()))
    rms_r = float(torch.sqrt((r ** 2).mean()))
    max_d = float(d[finite].max()) if bool(finite.all()) else float("inf")
    ok = bad == 0 and rms_d <= 0.02 * rms_r
    return {"result": "passed" if ok else "FAILED", "max_abs_diff": max_d, "max_abs_ref": float(r.abs().max()),
            "rms_diff": rms_d, "rms_ref": rms_r, "bad_elements": bad, "elements": r.numel(), "tolerance": TOLERANCE}


# ---- the peers ---------------------------------------------------------------------------------

def common_refusals(w):
    if w.kv_dtype != "bfloat16":
        raise Refused(f"kv_dtype {w.kv_dtype}: the peer takes keys/values in the activation dtype (bfloat16) only")


def sdpa_peer(torch, backend_name):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    backend = getattr(SDPBackend, backend_name)

    def build(w, inputs):
        common_refusals(w)
        if w.window is not None:
            raise Refused("sliding window: SDPA's flash/cuDNN kernels take no window (only an explicit mask, "
                          "which selects another kernel)")
        if not inputs.uniform:
            raise Refused("requests of different query lengths or contexts are not one dense [B, H, L, D] "
                          "SDPA call")
        q_len, ctx = inputs.reqs[0]
        if q_len > 1 and ctx > 0:
            raise Refused("causal queries after a context need a bottom-right causal mask; is_causal is top-left")
        q, k, v = inputs.dense()
        causal = q_len > 1
        notes = []
        if w.shared_prefix:
            notes.append("the shared prefix is a copy per request (no sharing)")
        gqa = {"enable_gqa": True} if w.num_q_heads != w.num_kv_heads else {}

        def call(kk=k, vv=v, extra=gqa):
            return F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, **extra)

        def first(kk=k, vv=v, extra=gqa):
            # torch says why a kernel cannot run in warnings, then raises "No available kernel".
            with warnings.catch_warnings(record=True) as caught, sdpa_kernel(backend):
                warnings.simplefilter("always")
                try:
                    return call(kk, vv, extra)
                except RuntimeError as e:
                    why = "; ".join(str(c.message).splitlines()[0][:200] for c in caught) or str(e).splitlines()[0]
                    raise Refused(f"torch refused {backend_name}: {why}") from None

        try:
            first()
            fn = call
        except Refused as e:
            if not gqa:
                raise
            # This kernel does not take GQA: the KV heads repeated to every query head. It then reads
            # ratio x the KV bytes; the rate stays the workload's (its bytes / time).
            ratio = w.num_q_heads // w.num_kv_heads
            k_rep, v_rep = k.repeat_interleave(ratio, dim=1), v.repeat_interleave(ratio, dim=1)
            notes.append(f"GQA not taken ({str(e)[:160]}): KV heads repeated x{ratio} before the "
                         "call (not timed), the kernel reads that many more KV bytes")
            first(k_rep, v_rep, {})

            def fn():
                return call(k_rep, v_rep, {})
        # The kernel choice is made once, around the check and the timed calls (not inside each call).
        return fn, (lambda out: inputs.from_dense(out)), "; ".join(notes), (lambda: sdpa_kernel(backend))

    return build


def flex_peer(torch):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)

    def build(w, inputs):
        common_refusals(w)
        window = w.window
        gqa = w.num_q_heads != w.num_kv_heads
        if inputs.uniform:
            q_len, ctx = inputs.reqs[0]
            offset = ctx  # query i is at position ctx + i

            def mask(b, h, qi, ki):
                keep = ki <= qi + offset
                if window is not None:
                    keep = keep & (qi + offset - ki < window)
                return keep

            q, k, v = inputs.dense()
            bm = create_block_mask(mask, B=None, H=None, Q_LEN=q_len, KV_LEN=inputs.seq_lens[0], device="cuda")

            def fn():
                return compiled(q, k, v, block_mask=bm, enable_gqa=gqa)
            return fn, (lambda out: inputs.from_dense(out)), ("the shared prefix is a copy per request (no sharing)"
                                                              if w.shared_prefix else ""), contextlib.nullcontext
        # A packed batch: one sequence of every request's rows, masked to each request's own keys.
        tq, tk = inputs.cu_q[-1], inputs.cu_k[-1]
        n = len(inputs.reqs)
        pad = 256  # the kernel may evaluate the mask past the last row/key of a tile: lookups stay in bounds

        def owner(lens, total, filler):
            ids = torch.full((total + pad,), filler, dtype=torch.int64, device="cuda")
            ids[:total] = torch.repeat_interleave(torch.arange(n, device="cuda"), torch.tensor(lens, device="cuda"))
            return ids

        req_q = owner(inputs.q_lens, tq, n)      # padded rows: a request n that has no keys
        req_k = owner(inputs.seq_lens, tk, n + 1)  # padded keys: no request's
        cu_q = torch.tensor(inputs.cu_q, device="cuda")  # n + 1 entries: index n is valid
        cu_k = torch.tensor(inputs.cu_k, device="cuda")
        ctxs = torch.tensor([c for _, c in inputs.reqs] + [0], device="cuda")

        def mask(b, h, qi, ki):
            r = req_q[qi]
            pos = ctxs[r] + qi - cu_q[r]  # the query's position in its request
            kpos = ki - cu_k[r]
            keep = (req_k[ki] == r) & (kpos <= pos)
            if window is not None:
                keep = keep & (pos - kpos < window)
            return keep

        q = inputs.q.transpose(0, 1).unsqueeze(0).contiguous()  # [1, H, tokens, D]
        k = inputs.k.transpose(0, 1).unsqueeze(0).contiguous()
        v = inputs.v.transpose(0, 1).unsqueeze(0).contiguous()
        bm = create_block_mask(mask, B=None, H=None, Q_LEN=tq, KV_LEN=tk, device="cuda")

        def fn():
            return compiled(q, k, v, block_mask=bm, enable_gqa=gqa)
        return fn, (lambda out: out[0].transpose(0, 1)), "packed batch, request boundaries by mask", \
            contextlib.nullcontext

    return build


# ---- the run -----------------------------------------------------------------------------------

def rate_fields(w, sh, median_us, ceilings):
    seconds = median_us * 1e-6
    e = {"kv_tb_per_s": sh.kv_bytes / seconds / 1e12, "kv_gb_per_s": sh.kv_bytes / seconds / 1e9,
         "tflop_per_s": sh.flops / seconds / 1e12}
    if w.kind == "prefill":
        e.update(rate=e["tflop_per_s"], rate_unit="TFLOP/s", ceiling="bf16_gemm",
                 fraction_of_ceiling=e["tflop_per_s"] / ceilings["bf16_gemm_tflop_per_s"])
    else:
        e.update(rate=e["kv_tb_per_s"], rate_unit="TB/s", ceiling="copy",
                 fraction_of_ceiling=e["kv_tb_per_s"] / ceilings["copy_tb_per_s"])
    return e


def base_entry(w, sh):
    e = w.to_json()
    e.update(num_reqs=sh.num_reqs, num_tokens=sh.tokens, num_kv_blocks=sh.num_blocks, kv_bytes_read=sh.kv_bytes,
             flops=sh.flops, kv_cache_dtype=w.kv_dtype, graph_mode="eager", kv_layout="contiguous BHSD",
             status="ERROR", median_us=None, rate=None, fraction_of_ceiling=None)
    return e


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload-file", default=str(wl.DEFAULT_FILE))
    ap.add_argument("--workloads", default="default", help="default, all, or comma-separated names")
    ap.add_argument("--peers", default=",".join(SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", default=None, help="write DIR/peer_<system>.json")
    ap.add_argument("--time-budget", type=float, default=240.0,
                    help="seconds for the whole run; workloads not started within it are reported as not run "
                         "(default 240)")
    ap.add_argument("--peer-budget", type=float, default=90.0,
                    help="seconds one peer may spend (FlexAttention compiles per shape); past it the peer's "
                         "remaining workloads are reported as not run (default 90)")
    args = ap.parse_args(argv)
    if args.iters < 1 or args.warmup < 0:
        ap.error("--iters must be >= 1 and --warmup >= 0")
    peers = [p for p in args.peers.split(",") if p]
    for p in peers:
        if p not in SYSTEMS:
            ap.error(f"--peers: unknown peer {p!r} (allowed: {', '.join(SYSTEMS)})")
    try:
        table = wl.select(wl.load(args.workload_file), args.workloads)
    except wl.WorkloadError as e:
        print(f"peers.py: {e}", file=sys.stderr)
        return 2

    reason = no_gpu_reason()
    if reason:
        print(f"no GPU: {reason}")
        return 0
    import torch
    import attnkit

    # One compiled flex kernel per shape: more recompilations than the default limit allows.
    for key, value in (("cache_size_limit", 512), ("recompile_limit", 512), ("accumulated_cache_size_limit", 4096),
                       ("accumulated_recompile_limit", 4096)):
        if hasattr(torch._dynamo.config, key):
            setattr(torch._dynamo.config, key, value)
    began = time.monotonic()
    cond = conditions(torch, attnkit)
    print(f"measuring ceilings on {cond['gpu_name']} ...", file=sys.stderr)
    ceilings = measure_ceilings(torch)
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    builders = {}
    for p in peers:
        try:
            if p == "torch-sdpa-flash":
                builders[p] = sdpa_peer(torch, "FLASH_ATTENTION")
            elif p == "torch-sdpa-cudnn":
                builders[p] = sdpa_peer(torch, "CUDNN_ATTENTION")
            else:
                builders[p] = flex_peer(torch)
        except (ImportError, AttributeError) as e:
            builders[p] = e  # this torch lacks the API: every workload says so
    results = {p: [] for p in peers}
    spent = {p: 0.0 for p in peers}
    lost = False
    for w in table:
        sh = wl.shape_of(w)
        why_not = None
        if lost:
            why_not = "not run: the CUDA context was lost earlier"
        elif time.monotonic() - began > args.time_budget:
            why_not = f"not run: the time budget of {args.time_budget:.0f} s was spent"
        if why_not:
            for p in peers:
                e = base_entry(w, sh)
                e.update(status="NOT RUN", error=why_not)
                results[p].append(e)
            continue
        print(f"running {w.name} ...", file=sys.stderr)
        inputs = ref = None
        for p in peers:
            e = base_entry(w, sh)
            results[p].append(e)
            if spent[p] > args.peer_budget:
                e.update(status="NOT RUN", error=f"not run: this peer spent its budget of {args.peer_budget:.0f} s")
                continue
            peer_began = time.monotonic()
            try:
                if isinstance(builders[p], Exception):
                    raise Refused(f"this torch ({torch.__version__}) lacks the API: {builders[p]}")
                common_refusals(w)
                if inputs is None:
                    inputs = Inputs(torch, w)
                fn, unpack, notes, scope = builders[p](w, inputs)
                with scope():
                    out = unpack(fn())
                if ref is None:
                    ref_began = time.monotonic()
                    ref = reference(torch, attnkit, inputs)
                    peer_began += time.monotonic() - ref_began  # the reference is nobody's time
                e["check"] = compare(torch, out, ref)
                e["notes"] = notes
                del out
                with scope():
                    samples = time_calls(torch, fn, args.iters, args.warmup, flush)
                    clean = stats(time_calls(torch, fn, args.iters, 0, flush, clean=True))
                st = stats(samples)
                if e["check"]["result"] == "passed":
                    e.update(status="OK", median_us=st["median"], min_us=st["min"], p90_us=st["p90"],
                             max_us=st["max"], samples_us=samples, **rate_fields(w, sh, st["median"], ceilings),
                             clean_flush_us={"median": clean["median"], "min": clean["min"], "p90": clean["p90"]})
                else:
                    e.update(status="FAILED", unvalidated={"median_us": st["median"], "min_us": st["min"]})
            except Refused as r:
                e.update(status="REFUSED", error=str(r), refusal={"by": "peer", "reasons": [str(r)]})
            except Exception as x:  # noqa: BLE001  (one peer's failure is reported, the run goes on)
                e.update(status="ERROR", error=f"{type(x).__name__}: {str(x).splitlines()[0] if str(x) else ''}"[:500])
                try:
                    torch.cuda.synchronize()
                except Exception as sticky:  # noqa: BLE001  (a lost context: the rest cannot run)
                    print(f"peers.py: the CUDA context is lost ({sticky}); stopping", file=sys.stderr)
                    lost = True
            spent[p] += time.monotonic() - peer_began
            if lost:
                for rest in peers[peers.index(p) + 1:]:
                    skipped = base_entry(w, sh)
                    skipped.update(status="NOT RUN", error="not run: the CUDA context was lost")
                    results[rest].append(skipped)
                break
            line = e["status"] if e["status"] != "OK" else f"{e['median_us']:.1f} us"
            print(f"  {p}: {line}" + (f" ({e.get('error')})" if e["status"] not in ("OK",) else ""), file=sys.stderr)
        del inputs, ref
        if not lost:
            torch.cuda.empty_cache()

    docs = {}
    for p in peers:
        docs[p] = {"schema": "attnkit-bench/2", "system": SYSTEMS[p], "system_kind": "peer", "conditions": cond,
                   "ceilings": ceilings,
                   "config": {"backend": SYSTEMS[p], "peer": p, "iters": args.iters, "warmup": args.warmup,
                              "check": "against attnkit GPU_REFERENCE through the binding", "paged_kv": False,
                              "graph_mode": "eager", "workload_file": args.workload_file,
                              "activation_dtype": "bfloat16", "l2_flush_bytes": FLUSH_BYTES},
                   "workloads": results[p]}
    for p in peers:
        print(f"== {SYSTEMS[p]}")
        for e in results[p]:
            cell = (f"{e['median_us']:.1f} us, {e['rate']:.3g} {e['rate_unit']}, "
                    f"{100 * e['fraction_of_ceiling']:.1f}% of ceiling" if e["status"] == "OK"
                    else f"{e['status']}: {e.get('error') or e.get('check', {}).get('result', '')}")
            print(f"  {e['name']}: {cell}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for p, doc in docs.items():
            (out / f"peer_{p}.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {', '.join(f'peer_{p}.json' for p in docs)} to {out}", file=sys.stderr)
    bad = any(e["status"] in ("FAILED", "ERROR") for r in results.values() for e in r)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
