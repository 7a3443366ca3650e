"""A small engine for the Python tests: a scheduler, a block manager and the brute-force attention
every output is checked against. Written from docs/design.md "Exact semantics", independently of the
library: it keeps each request's K/V history itself and never reads the runner's cache.

The engine loop is the one docs/guide.md describes: order_requests, build the step in that order,
prepare_step, then every layer inside runner.forward(); the KV cache is filled only through the
runner's own KV update (this step's key/value rows), as in a real engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


def random_values(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Uniform in [-1, -0.05] U [0.05, 1]: random and never zero, so a skipped write cannot pass."""
    magnitude = rng.uniform(0.05, 1.0, size=shape)
    sign = np.where(rng.random(size=shape) < 0.5, -1.0, 1.0)
    return (magnitude * sign).astype(dtype)


def brute_force_attention(q, k, v, context, *, scale=None, window=None, soft_cap=None, sinks=None, causal=True):
    """One request's attention in float64.

    q: [query_len, q_heads, d]; k, v: [seq_len, kv_heads, d] (every key of the request, context first);
    context: keys before this step's first query. Returns (out [query_len, q_heads, d], lse
    [query_len, q_heads]), natural log, sinks in the denominator (and in the LSE).
    """
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64)
    v = np.asarray(v, np.float64)
    query_len, q_heads, d = q.shape
    seq_len, kv_heads, _ = k.shape
    group = q_heads // kv_heads
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = np.zeros((query_len, q_heads, d))
    lse = np.full((query_len, q_heads), -np.inf)
    positions = context + np.arange(query_len)[:, None]  # [query_len, 1]
    keys = np.arange(seq_len)[None, :]  # [1, seq_len]
    visible = np.ones((query_len, seq_len), bool)
    if causal:
        visible &= keys <= positions
    if window is not None:
        visible &= positions - keys < window
    for h in range(q_heads):
        kv = h // group
        s = scale * (q[:, h, :] @ k[:, kv, :].T)  # [query_len, seq_len]
        if soft_cap is not None:
            s = soft_cap * np.tanh(s / soft_cap)
        s = np.where(visible, s, -np.inf)
        m = s.max(axis=1, keepdims=True)
        if sinks is not None:
            m = np.maximum(m, sinks[h])
        m = np.where(np.isfinite(m), m, 0.0)
        e = np.exp(s - m)
        denom = e.sum(axis=1, keepdims=True)
        if sinks is not None:
            denom = denom + np.exp(sinks[h] - m)
        rows = denom[:, 0] > 0
        out[rows, h, :] = (e[rows] @ v[:, kv, :]) / denom[rows]
        lse[rows, h] = np.log(denom[rows, 0]) + m[rows, 0]
    return out, lse


@dataclass
class Request:
    id: int
    total_len: int  # tokens it will have when finished
    computed: int = 0
    blocks: list = field(default_factory=list)  # per KV group: manager block ids in logical order
    k: dict = field(default_factory=dict)  # layer name -> [computed, kv_heads, d] float64 history
    v: dict = field(default_factory=dict)


class Engine:
    """Drives a ModelRunner through random mixed steps and checks each layer's output and LSE."""

    def __init__(self, runner, layers, np_dtype, rng, *, need_lse=True, rtol=3e-3, atol=3e-3, to_device=None,
                 to_host=None, stream=0, synchronize=None):
        """to_device/to_host: how the step's tensors reach the runner's memory and come back (default:
        NumPy arrays as they are, the CPU platform); stream: the handle passed to prepare_step and
        attention; synchronize: called before the outputs are read."""
        self.runner = runner
        self.to_device = to_device or (lambda a: a)
        self.to_host = to_host or (lambda t: t)
        self.stream = stream
        self.synchronize = synchronize or (lambda: None)
        self.layers = [dict(vars(l)) if not isinstance(l, dict) else dict(l) for l in layers]
        self.np_dtype = np_dtype
        self.rng = rng
        self.need_lse = need_lse
        self.rtol, self.atol = rtol, atol
        self.groups = runner.kv_groups
        self.free = []
        for g in self.groups:
            ids = list(range(g["num_blocks"]))
            rng.shuffle(ids)  # physical ids in no particular order
            self.free.append(ids)
        self.requests: dict[int, Request] = {}
        self.next_id = 100
        self.steps_run = 0
        self.rows_checked = 0

    # --- the scheduler ----------------------------------------------------------------------
    def add_request(self, total_len: int) -> Request:
        r = Request(self.next_id, total_len, blocks=[[] for _ in self.groups])
        for layer in self.layers:
            kvh, d = layer["num_kv_heads"], layer["head_size"]
            r.k[layer["name"]] = np.zeros((0, kvh, d))
            r.v[layer["name"]] = np.zeros((0, kvh, d))
        self.requests[r.id] = r
        self.next_id += 1
        return r

    def random_schedule(self, max_tokens: int):
        """A mixed batch: decodes of running requests, chunks of prefills, one new request."""
        sched = []
        budget = max_tokens
        for r in list(self.requests.values()):
            remaining = r.total_len - r.computed
            if remaining <= 0 or budget <= 0:
                continue
            if r.computed > 0 and self.rng.random() < 0.6:
                n = 1  # decode
            else:
                n = int(self.rng.integers(1, 12))  # prefill chunk / extend
            n = min(n, remaining, budget)
            sched.append((r.id, n))
            budget -= n
        return sched

    # --- one step ---------------------------------------------------------------------------
    def _blocks_for(self, r: Request, seq_len: int):
        for g, group in enumerate(self.groups):
            need = -(-seq_len // group["block_size"])
            while len(r.blocks[g]) < need:
                r.blocks[g].append(self.free[g].pop())

    def step(self, sched):
        """Runs one step of (request id, query_len) in the scheduler's order; checks every layer."""
        runner = self.runner
        order = runner.order_requests([rid for rid, _ in sched], [n for _, n in sched])
        assert sorted(order) == list(range(len(sched)))
        batch = [sched[i] for i in order]
        reqs = [self.requests[rid] for rid, _ in batch]
        lens = [n for _, n in batch]
        computed = [r.computed for r in reqs]
        for r, n in zip(reqs, lens):
            self._blocks_for(r, r.computed + n)
        tables = [[r.blocks[g] for r in reqs] for g in range(len(self.groups))]
        num_tokens = sum(lens)
        rows = runner.shape_for(len(batch), num_tokens)["num_tokens_padded"]
        runner.prepare_step(np.array([r.id for r in reqs], np.int32), lens, np.array(computed, np.int64), tables,
                            order=order, stream=self.stream)

        starts = np.concatenate([[0], np.cumsum(lens)]).astype(int)
        results = {}
        with runner.forward():
            for layer in self.layers:
                name, qh, kvh, d = layer["name"], layer["num_q_heads"], layer["num_kv_heads"], layer["head_size"]
                q = random_values(self.rng, (rows, qh, d), self.np_dtype)
                k = random_values(self.rng, (rows, kvh, d), self.np_dtype)
                v = random_values(self.rng, (rows, kvh, d), self.np_dtype)
                out = np.full((rows, qh, d), np.nan, self.np_dtype)
                lse = np.full((rows, qh), np.nan, np.float32) if self.need_lse else None
                dev = [self.to_device(a) if a is not None else None for a in (q, k, v, out, lse)]
                runner.attention(name, *dev, stream=self.stream)
                results[name] = (q, k, v, dev[3], dev[4])
        self.synchronize()
        for name in results:
            q, k, v, out, lse = results[name]
            results[name] = (q, k, v, self.to_host(out), self.to_host(lse) if lse is not None else None)

        for layer in self.layers:
            name = layer["name"]
            q, k, v, out, lse = results[name]
            real = out[:num_tokens]
            assert not np.isnan(real).any(), f"{name}: rows left unwritten (NaN) in the output"
            if lse is not None:
                assert not np.isnan(lse[:num_tokens]).any(), f"{name}: LSE rows left unwritten"
            for i, r in enumerate(reqs):
                a, b = starts[i], starts[i + 1]
                k_all = np.concatenate([r.k[name], k[a:b].astype(np.float64)])
                v_all = np.concatenate([r.v[name], v[a:b].astype(np.float64)])
                want_out, want_lse = brute_force_attention(
                    q[a:b], k_all, v_all, r.computed, scale=layer.get("scale"), window=layer.get("sliding_window"),
                    soft_cap=layer.get("soft_cap"), sinks=layer.get("sinks"))
                np.testing.assert_allclose(out[a:b].astype(np.float64), want_out, rtol=self.rtol, atol=self.atol,
                                           err_msg=f"{name}: request {r.id} (context {r.computed}, {b - a} new)")
                if lse is not None:
                    np.testing.assert_allclose(lse[a:b], want_lse, rtol=1e-4, atol=2e-3,
                                               err_msg=f"{name}: LSE of request {r.id}")
                r.k[name] = k_all
                r.v[name] = v_all
                self.rows_checked += b - a
        for r, n in zip(reqs, lens):
            r.computed += n
        self.steps_run += 1
        return order
