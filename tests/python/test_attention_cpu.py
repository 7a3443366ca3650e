"""The CPU platform's backends against an independent brute-force attention (engine_sim.py).

Each test drives a ModelRunner as an engine does: random mixed batches (decodes, prefill chunks,
new requests) over several steps, so later steps read context that earlier steps wrote into the
paged cache through the runner's KV update. Outputs and LSEs are poisoned with NaN first; every
real row must be written and match.
"""

import numpy as np
import pytest

import attnkit
from engine_sim import Engine, random_values


def make_runner(layers, backend, **config):
    cfg = attnkit.RunnerConfig(platform="cpu", backend=backend, max_num_reqs=8, max_num_tokens=64, max_model_len=96,
                               num_blocks=64, need_lse=True, **config)
    return attnkit.ModelRunner(layers, cfg)


def run_random_steps(runner, layers, np_dtype, seed, steps=4, **tolerances):
    rng = np.random.default_rng(seed)
    engine = Engine(runner, layers, np_dtype, rng, **tolerances)
    for step in range(steps):
        for _ in range(int(rng.integers(1, 3))):
            engine.add_request(int(rng.integers(8, 60)))
        sched = engine.random_schedule(max_tokens=48)
        assert sched, "the scheduler made an empty step"
        engine.step(sched)
    assert engine.rows_checked > 0
    return engine


GQA_LAYERS = [
    attnkit.LayerSpec("layers.0.attn", num_q_heads=4, num_kv_heads=2, head_size=64, dtype="float16"),
    attnkit.LayerSpec("layers.1.attn", num_q_heads=4, num_kv_heads=2, head_size=64, dtype="float16", sliding_window=8),
]


@pytest.mark.parametrize("backend", ["REFERENCE", "VARLEN", "CSR_PLAN", "auto"])
def test_backend_matches_brute_force_on_random_mixed_batches(backend):
    runner = make_runner(GQA_LAYERS, backend)
    for name in runner.layer_names:
        sel = runner.selection(name)
        if backend == "auto":
            assert not sel.explicit and sel.backend == attnkit.priority_list("cpu")[0]
        else:
            assert sel.explicit and sel.backend == backend
    # Full attention and a window of 8 cannot share a block table: two KV-cache groups.
    assert len(runner.kv_groups) == 2
    engine = run_random_steps(runner, GQA_LAYERS, np.float16, seed=["REFERENCE", "VARLEN", "CSR_PLAN", "auto"].index(backend) + 1)
    assert engine.steps_run == 4


def test_reference_float32_with_soft_cap_sinks_and_scale():
    rng = np.random.default_rng(7)
    layers = [attnkit.LayerSpec("attn", num_q_heads=6, num_kv_heads=2, head_size=64, dtype="float32", soft_cap=2.5,
                                scale=0.2, sinks=list(rng.uniform(-1, 1, size=6)))]
    runner = make_runner(layers, "REFERENCE")
    run_random_steps(runner, layers, np.float32, seed=8, rtol=1e-5, atol=1e-5)


def test_manager_blocks_larger_than_kernel_pages():
    # A manager block of 32 tokens holds two kernel pages of 16 (K5): the block table the engine
    # gives and the cache view the runner exposes both follow that expansion.
    layers = [dict(name="attn", num_q_heads=4, num_kv_heads=1, head_size=128, dtype="float16", block_size=32,
                   kernel_block_size=16)]
    runner = make_runner(layers, "VARLEN")
    (group,) = runner.kv_groups
    assert group["block_size"] == 32 and group["kernel_block_size"] == 16
    info = runner.kv_cache_info("attn")
    assert info["block_size"] == 16 and info["num_blocks"] == 2 * group["num_blocks"]
    run_random_steps(runner, layers, np.float16, seed=11)


def test_kv_cache_view_shows_what_the_kv_update_wrote_and_feeds_attention():
    layer = attnkit.LayerSpec("attn", num_q_heads=2, num_kv_heads=2, head_size=64, dtype="float16")
    runner = make_runner([layer], "REFERENCE")
    k_cache, v_cache = runner.kv_cache("attn")
    assert k_cache.shape == (64, 16, 2, 64) and k_cache.dtype == np.float16
    assert np.isnan(k_cache).all() and np.isnan(v_cache).all(), "a fresh cache holds the NaN poison"
    rng = np.random.default_rng(3)

    # Step 1: one request, 5 new tokens in block 9: the KV update writes them at slots 9*16 + 0..4.
    runner.prepare_step([0], [5], [0], [[[9]]], order=runner.order_requests([0], [5]))
    q = random_values(rng, (5, 2, 64), np.float16)
    k = random_values(rng, (5, 2, 64), np.float16)
    v = random_values(rng, (5, 2, 64), np.float16)
    out = np.full_like(q, np.nan)
    with runner.forward():
        runner.attention("attn", q, k, v, out)
    np.testing.assert_array_equal(k_cache[9, :5], k)
    np.testing.assert_array_equal(v_cache[9, :5], v)
    assert np.isnan(k_cache[9, 5:]).all() and np.isnan(k_cache[8]).all(), "only the step's slots are written"

    # Step 2: a request whose 20 context tokens the test writes into the cache itself (blocks 3, 4).
    ctx_k = random_values(rng, (20, 2, 64), np.float16)
    ctx_v = random_values(rng, (20, 2, 64), np.float16)
    for p in range(20):
        block = (3, 4)[p // 16]
        k_cache[block, p % 16] = ctx_k[p]
        v_cache[block, p % 16] = ctx_v[p]
    q = random_values(rng, (2, 2, 64), np.float16)
    k = random_values(rng, (2, 2, 64), np.float16)
    v = random_values(rng, (2, 2, 64), np.float16)
    out = np.full_like(q, np.nan)
    runner.prepare_step([1], [2], [20], [[[3, 4]]], order=runner.order_requests([1], [2]))
    with runner.forward():
        runner.attention("attn", q, k, v, out)
    from engine_sim import brute_force_attention

    want, _ = brute_force_attention(q, np.concatenate([ctx_k, k]), np.concatenate([ctx_v, v]), 20)
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=3e-3, atol=3e-3)


def test_reorder_puts_decodes_first_for_csr_plan():
    layer = attnkit.LayerSpec("attn", num_q_heads=2, num_kv_heads=1, head_size=64, dtype="float16")
    runner = make_runner([layer], "CSR_PLAN")
    assert runner.reorder_batch_threshold == 1
    order = runner.order_requests([10, 11, 12, 13], [5, 1, 3, 1])
    assert list(order) == [1, 3, 0, 2] and order.order == [1, 3, 0, 2]
    assert order.request_ids == [11, 13, 10, 12] and order.query_lens == [1, 1, 5, 3]
    assert order.position_of == [2, 0, 3, 1]
    # Row t of the step is the scheduler's token row token_order[t]: q_step = q_sched[token_order].
    assert order.token_order == [5, 9, 0, 1, 2, 3, 4, 6, 7, 8]
    identity = make_runner([layer], "REFERENCE")
    assert identity.reorder_batch_threshold is None
    assert list(identity.order_requests([10, 11, 12, 13], [5, 1, 3, 1])) == [0, 1, 2, 3]


def test_bfloat16_through_torch_dlpack_on_the_cpu():
    torch = pytest.importorskip("torch", reason="bfloat16 crosses by DLPack from torch; NumPy has no bfloat16")
    layer = attnkit.LayerSpec("attn", num_q_heads=4, num_kv_heads=2, head_size=64, dtype="bfloat16")
    runner = make_runner([layer], "REFERENCE")
    rng = np.random.default_rng(5)
    q32 = random_values(rng, (6, 4, 64), np.float32)
    k32 = random_values(rng, (6, 2, 64), np.float32)
    v32 = random_values(rng, (6, 2, 64), np.float32)
    q, k, v = (torch.from_numpy(a).to(torch.bfloat16) for a in (q32, k32, v32))
    out = torch.full((6, 4, 64), float("nan"), dtype=torch.bfloat16)
    runner.prepare_step([0, 1], [4, 2], [0, 0], [[[1], [2]]], order=runner.order_requests([0, 1], [4, 2]))
    with runner.forward():
        runner.attention("attn", q, k, v, out)
    assert not torch.isnan(out).any()
    qf, kf, vf = (t.to(torch.float64).numpy() for t in (q, k, v))
    from engine_sim import brute_force_attention

    for a, b in ((0, 4), (4, 6)):
        want, _ = brute_force_attention(qf[a:b], kf[a:b], vf[a:b], 0)
        np.testing.assert_allclose(out[a:b].to(torch.float64).numpy(), want, rtol=2e-2, atol=2e-2)
