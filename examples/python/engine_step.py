"""engine_step.py: a minimal engine loop over attnkit from Python, on the CPU platform.

A 2-layer model (layer 0 full attention, layer 1 a sliding window of 8 tokens, hence two KV-cache
groups) runs 3 steps: two requests prefill, then a third joins with its prefill while they decode,
then all three decode. Pass a backend name (VARLEN, CSR_PLAN, REFERENCE) to force one; the default is
auto selection. Every output is checked against a brute-force attention computed here from the
same random Q/K/V. Exit status: 0 when everything matches, 1 on a mismatch, 2 on an attnkit.Error.

    PYTHONPATH=build/python python3 examples/python/engine_step.py [BACKEND]
"""

import math
import sys

import numpy as np

import attnkit

Q_HEADS, KV_HEADS, HEAD_SIZE, BLOCK, WINDOW = 4, 2, 64, 16, 8


def brute_force(q, k, v, context, window):
    """One request, float64: q [n, Q_HEADS, d], k/v [context + n, KV_HEADS, d]."""
    n = q.shape[0]
    pos = context + np.arange(n)[:, None]
    key = np.arange(k.shape[0])[None, :]
    visible = (key <= pos) & ((pos - key < window) if window else True)
    out = np.empty(q.shape)
    for h in range(Q_HEADS):
        kv = h // (Q_HEADS // KV_HEADS)
        s = np.where(visible, q[:, h] @ k[:, kv].T / math.sqrt(HEAD_SIZE), -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h] = (p / p.sum(axis=1, keepdims=True)) @ v[:, kv]
    return out


def main(backend=None):
    layers = [
        attnkit.LayerSpec("layers.0.attn", Q_HEADS, KV_HEADS, HEAD_SIZE, dtype="float16", block_size=BLOCK),
        attnkit.LayerSpec("layers.1.attn", Q_HEADS, KV_HEADS, HEAD_SIZE, dtype="float16", block_size=BLOCK,
                          sliding_window=WINDOW),
    ]
    config = attnkit.RunnerConfig(platform="cpu", backend=backend, max_num_reqs=4, max_num_tokens=64,
                                  max_model_len=64, num_blocks=attnkit.kv_blocks_for_memory_budget(layers, 256 * 1024))
    runner = attnkit.ModelRunner(layers, config, log=print)  # selection happens here
    for name in runner.layer_names:
        print(f"{name} runs {runner.selection(name).choice_line}")

    rng = np.random.default_rng(0)
    free = [list(range(g["num_blocks"]))[::-1] for g in runner.kv_groups]  # a block manager per KV group
    blocks = {}       # request id -> [block ids of group 0, of group 1]
    computed = {}     # request id -> tokens in the cache
    history = {}      # (request id, layer) -> (K, V) so far, for the brute-force check
    schedule = [[(0, 5), (1, 3)], [(2, 7), (0, 1), (1, 1)], [(0, 1), (1, 1), (2, 1)]]
    for step, sched in enumerate(schedule):
        # G8: the order the runner wants, for the scheduler's requests (ids, query lengths)
        order = runner.order_requests([rid for rid, _ in sched], [n for _, n in sched])
        batch = [sched[i] for i in order]
        for rid, n in batch:
            computed.setdefault(rid, 0)
            blocks.setdefault(rid, [[] for _ in free])
            for g, group in enumerate(runner.kv_groups):
                while len(blocks[rid][g]) * group["block_size"] < computed[rid] + n:
                    blocks[rid][g].append(free[g].pop())
        ids = [rid for rid, _ in batch]
        lens = [n for _, n in batch]
        tables = [[blocks[rid][g] for rid in ids] for g in range(len(free))]
        runner.prepare_step(ids, lens, [computed[rid] for rid in ids], tables, order=order)

        tokens = sum(lens)
        worst = 0.0
        with runner.forward():
            for layer in layers:
                q = rng.uniform(-1, 1, (tokens, Q_HEADS, HEAD_SIZE)).astype(np.float16)
                k = rng.uniform(-1, 1, (tokens, KV_HEADS, HEAD_SIZE)).astype(np.float16)
                v = rng.uniform(-1, 1, (tokens, KV_HEADS, HEAD_SIZE)).astype(np.float16)
                out = np.full_like(q, np.nan)
                runner.attention(layer.name, q, k, v, out)
                start = 0
                for rid, n in batch:
                    hk, hv = history.get((rid, layer.name), (np.zeros((0, KV_HEADS, HEAD_SIZE)),) * 2)
                    hk = np.concatenate([hk, k[start:start + n].astype(np.float64)])
                    hv = np.concatenate([hv, v[start:start + n].astype(np.float64)])
                    history[(rid, layer.name)] = (hk, hv)
                    want = brute_force(q[start:start + n].astype(np.float64), hk, hv, computed[rid],
                                       layer.sliding_window)
                    got = out[start:start + n].astype(np.float64)
                    worst = max(worst, np.inf if np.isnan(got).any() else float(np.abs(got - want).max()))
                    start += n
        for rid, n in batch:
            computed[rid] += n
        print(f"step {step}: {len(batch)} requests, {tokens} tokens, order {list(order)}, max |out - brute force| {worst:.2e}")
        if not worst < 3e-3:
            print("mismatch against the brute-force attention", file=sys.stderr)
            return 1
    print("all outputs match the brute-force attention")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
    except attnkit.Error as e:
        print(f"attnkit.Error: {e}\n  field: {e.field}\n  value: {e.value}\n  allowed: {e.allowed}", file=sys.stderr)
        sys.exit(2)
