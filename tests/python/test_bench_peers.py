"""bench/peers.py's reference on the CPU: the step it hands attnkit (block tables a random
permutation, a shared prefix on the same pages, context keys written into the paged cache at the
kernel pages, the step's own keys through runner.attention, rows back in the scheduler's order) run
on the CPU REFERENCE backend with NumPy arrays, against a brute-force attention per request. On the
device the same code runs GPU_REFERENCE on torch tensors: a mistake here would fail every peer's
check there."""

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import attnkit
from engine_sim import brute_force_attention

SOURCE = Path(os.environ.get("ATTNKIT_SOURCE_DIR", Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(SOURCE / "bench"))

import peers  # noqa: E402
import workloads as wl  # noqa: E402


class NumpyOps:
    def index(self, values):
        return np.asarray(values, dtype=np.int64)

    def arange(self, begin, end):
        return np.arange(begin, end)

    def cat(self, arrays):
        return np.concatenate(arrays)

    def nan_like(self, x):
        return np.full_like(x, np.nan)

    def empty_like(self, x):
        return np.empty_like(x)

    def kv_cache(self, runner, layer):
        return runner.kv_cache(layer)

    def synchronize(self):
        pass

    def stream(self):
        return 0


def workload(tmp_path, **fields):
    base = {"name": "w", "kind": "mixed", "num_q_heads": 4, "num_kv_heads": 2, "head_size": 64,
            "dtype": "bfloat16", "kv_dtype": "bfloat16", "page_size": 16, "window": None, "shared_prefix": 0}
    base.update(fields)
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"workloads": [base]}))
    return wl.load(path)[0]


def test_the_mixed_case_is_reordered_by_csr_plan():
    layer = attnkit.LayerSpec("attn", num_q_heads=4, num_kv_heads=2, head_size=64, dtype="float16")
    runner = attnkit.ModelRunner([layer], attnkit.RunnerConfig(platform="cpu", backend="CSR_PLAN"))
    q_lens = [q for q, _ in workload_requests("mixed")]
    assert list(runner.order_requests(list(range(len(q_lens))), q_lens)) != list(range(len(q_lens)))


def workload_requests(case):
    return [(g["query_len"], g["num_computed_tokens"]) for g in CASES[case]["requests"] for _ in range(g["count"])]


CASES = {
    # decodes after prefills in the scheduler's order: the runner reorders them
    "mixed": dict(requests=[{"count": 1, "query_len": 6, "num_computed_tokens": 37},
                            {"count": 2, "query_len": 1, "num_computed_tokens": 45},
                            {"count": 1, "query_len": 5, "num_computed_tokens": 0}]),
    "shared_prefix": dict(kind="decode", shared_prefix=32,
                          requests=[{"count": 3, "query_len": 1, "num_computed_tokens": 43}]),
    "window": dict(window=20, requests=[{"count": 1, "query_len": 7, "num_computed_tokens": 30},
                                        {"count": 2, "query_len": 1, "num_computed_tokens": 50}]),
}


# CSR_PLAN reorders the step (decodes first), so the rows must come back in the scheduler's order.
@pytest.mark.parametrize("backend,dtype,tol", [("REFERENCE", np.float32, 1e-4), ("CSR_PLAN", np.float16, 3e-3)])
@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_step_matches_brute_force(tmp_path, case, backend, dtype, tol):
    w = workload(tmp_path, name=case, **CASES[case])
    rng = np.random.default_rng(7)
    reqs = w.requests
    cu_q, cu_k = [0], [0]
    for q_len, ctx in reqs:
        cu_q.append(cu_q[-1] + q_len)
        cu_k.append(cu_k[-1] + q_len + ctx)
    q = rng.uniform(-1, 1, (cu_q[-1], w.num_q_heads, w.head_size)).astype(dtype)
    k = rng.uniform(-1, 1, (cu_k[-1], w.num_kv_heads, w.head_size)).astype(dtype)
    v = rng.uniform(-1, 1, (cu_k[-1], w.num_kv_heads, w.head_size)).astype(dtype)
    for r in range(1, len(reqs)):  # a shared prefix is the same keys/values in every request
        k[cu_k[r]:cu_k[r] + w.shared_prefix] = k[:w.shared_prefix]
        v[cu_k[r]:cu_k[r] + w.shared_prefix] = v[:w.shared_prefix]
    out = peers.reference_output(attnkit, w, q, k, v, cu_q, cu_k, NumpyOps(), platform="cpu", backend=backend,
                                 dtype=np.dtype(dtype).name)
    assert not np.isnan(out).any()
    for r, (q_len, ctx) in enumerate(reqs):
        want, _ = brute_force_attention(q[cu_q[r]:cu_q[r + 1]], k[cu_k[r]:cu_k[r + 1]], v[cu_k[r]:cu_k[r + 1]], ctx,
                                        window=w.window)
        np.testing.assert_allclose(out[cu_q[r]:cu_q[r + 1]], want, rtol=tol, atol=tol, err_msg=f"request {r}")


def test_block_tables_are_a_permutation_with_the_prefix_shared(tmp_path):
    w = workload(tmp_path, kind="decode", shared_prefix=32, requests=[{"count": 3, "query_len": 1,
                                                                       "num_computed_tokens": 43}])
    sh = wl.shape_of(w)
    rows = peers.block_tables(w, [2, 0, 1], sh.num_blocks, sh.max_pages)
    assert [row[:2] for row in rows] == [rows[0][:2]] * 3  # 32 tokens = 2 pages, the same in every request
    own = [b for row in rows for b in row[2:]]
    assert sorted(own + rows[0][:2]) == list(range(sh.num_blocks))  # every block used once
    assert rows != peers.block_tables(workload(tmp_path, name="other", kind="decode", shared_prefix=32,
                                               requests=[{"count": 3, "query_len": 1, "num_computed_tokens": 43}]),
                                      [2, 0, 1], sh.num_blocks, sh.max_pages)  # seeded by the workload's name


def test_peers_without_a_gpu_or_torch_say_so(capsys):
    if peers.no_gpu_reason() is None:
        pytest.skip("this machine has torch and a GPU: the peers would run")
    assert peers.main(["--workloads", "decode_1x4096"]) == 0
    assert capsys.readouterr().out.startswith("no GPU: ")
    assert peers.main(["--workloads", "nope"]) == 2
