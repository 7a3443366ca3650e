"""The CUDA platform from Python: torch tensors on the GPU cross by DLPack (no copies) into
GPU_REFERENCE and VARLEN, checked against the same brute-force attention as the CPU backends.
Skipped, with the reason, where there is no usable GPU (any CUDA error counts as none) or no torch."""

import numpy as np
import pytest

import attnkit
from engine_sim import Engine, brute_force_attention, random_values

try:
    import torch
except ImportError:  # the device machine has it; this one may not
    torch = None


def _skip_reason():
    if not attnkit.built_with_cuda:
        return "this build of attnkit has no CUDA sources"
    if not attnkit.cuda_available():
        return f"no usable GPU: {attnkit.probe_gpu()['error'] or 'none found'}"
    if torch is None:
        return "the CUDA tests hand the runner torch CUDA tensors: torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no GPU"
    return None


SKIP_REASON = _skip_reason()
# Collected and skipped one by one (never an empty module): the reason shows in the summary.
pytestmark = pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")

def cuda_runner(layers, backend, **config):
    cfg = attnkit.RunnerConfig(platform="cuda", backend=backend, max_num_reqs=8, max_num_tokens=64,
                               max_model_len=96, num_blocks=64, need_lse=True, **config)
    return attnkit.ModelRunner(layers, cfg)


def on_gpu(array):
    return torch.from_numpy(np.ascontiguousarray(array)).cuda()


def to_host(tensor):
    return tensor.cpu().numpy()


def drive(runner, layers, np_dtype, seed, steps=4, stream=0, synchronize=None, **tol):
    rng = np.random.default_rng(seed)
    engine = Engine(runner, layers, np_dtype, rng, to_device=on_gpu, to_host=to_host, stream=stream,
                    synchronize=synchronize or torch.cuda.synchronize, **tol)
    for _ in range(steps):
        for _ in range(int(rng.integers(1, 3))):
            engine.add_request(int(rng.integers(8, 60)))
        engine.step(engine.random_schedule(max_tokens=48))
    assert engine.rows_checked > 0
    return engine


LAYERS = [
    attnkit.LayerSpec("layers.0.attn", num_q_heads=8, num_kv_heads=2, head_size=128, dtype="float16"),
    attnkit.LayerSpec("layers.1.attn", num_q_heads=8, num_kv_heads=2, head_size=128, dtype="float16",
                      sliding_window=8),
]


@pytest.mark.parametrize("backend", ["GPU_REFERENCE", "VARLEN"])
def test_cuda_backend_matches_brute_force(backend):
    runner = cuda_runner(LAYERS, backend)
    assert runner.platform.startswith("cuda")
    assert all(runner.selection(n).backend == backend for n in runner.layer_names)
    assert runner.kv_cache_info(0)["memory"] == "device"
    drive(runner, LAYERS, np.float16, seed=31 if backend == "VARLEN" else 32)


# G4: a soft-capped model of full and sliding-window layers (Gemma 2's shape): the two KV groups
# share a page size, and each backend that declares supports_update_block_table runs the sliding
# group from the full group's plan of the step with only its own page table swapped in.
G4_LAYERS = [
    attnkit.LayerSpec(f"layers.{i}.attn", num_q_heads=8, num_kv_heads=2, head_size=128, dtype="float16",
                      soft_cap=20.0, **({"sliding_window": 8} if i % 2 else {}))
    for i in range(4)
]


@pytest.mark.parametrize("backend", ["VARLEN", "FLASHINFER"])
def test_a_group_that_reuses_anothers_plan_matches_brute_force(backend):
    caps = {b["name"]: b for b in attnkit.backends()}
    if backend not in caps:
        pytest.skip(f"this build has no {backend} backend")
    runner = cuda_runner(G4_LAYERS, backend)
    groups = runner.kv_groups
    assert len(groups) == 2 and groups[0]["kernel_block_size"] == groups[1]["kernel_block_size"]
    rng = np.random.default_rng(36)
    engine = Engine(runner, G4_LAYERS, np.float16, rng, to_device=on_gpu, to_host=to_host,
                    synchronize=torch.cuda.synchronize)
    for _ in range(5):
        for _ in range(int(rng.integers(1, 3))):
            engine.add_request(int(rng.integers(8, 60)))
        engine.step(engine.random_schedule(max_tokens=48))
        reused = [g["reused_plan"] for g in runner.kv_groups]
        assert reused == [[False], [True]], f"{backend}: plan reuse per group {reused}"
    assert engine.rows_checked > 0


def test_gpu_reference_float32():
    layers = [attnkit.LayerSpec("attn", num_q_heads=4, num_kv_heads=4, head_size=64, dtype="float32", soft_cap=3.0)]
    drive(cuda_runner(layers, "GPU_REFERENCE"), layers, np.float32, seed=33, rtol=1e-4, atol=1e-4)


def test_work_runs_on_the_callers_stream():
    runner = cuda_runner(LAYERS, "VARLEN")
    stream = torch.cuda.Stream()
    # The inputs are made on the current stream; the step runs on `stream` after them.
    stream.wait_stream(torch.cuda.current_stream())
    drive(runner, LAYERS, np.float16, seed=34, steps=2, stream=stream.cuda_stream,
          synchronize=stream.synchronize)


def test_bfloat16_on_the_gpu():
    layer = attnkit.LayerSpec("attn", num_q_heads=8, num_kv_heads=2, head_size=128, dtype="bfloat16")
    for backend in ("GPU_REFERENCE", "VARLEN"):
        runner = cuda_runner([layer], backend)
        rng = np.random.default_rng(35)
        q, k, v = (torch.from_numpy(random_values(rng, shape, np.float32)).to("cuda", torch.bfloat16)
                   for shape in ((7, 8, 128), (7, 2, 128), (7, 2, 128)))
        out = torch.full((7, 8, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
        runner.prepare_step([0, 1], [1, 6], [0, 0], [[[3], [4]]], order=runner.order_requests([0, 1], [1, 6]))
        with runner.forward():
            runner.attention("attn", q, k, v, out)
        torch.cuda.synchronize()
        qf, kf, vf, of = (t.float().cpu().numpy() for t in (q, k, v, out))
        assert not np.isnan(of).any()
        for a, b in ((0, 1), (1, 7)):
            want, _ = brute_force_attention(qf[a:b], kf[a:b], vf[a:b], 0)
            np.testing.assert_allclose(of[a:b], want, rtol=2e-2, atol=2e-2, err_msg=backend)


def test_kv_cache_of_a_cuda_runner_is_a_device_array():
    layer = attnkit.LayerSpec("attn", num_q_heads=2, num_kv_heads=2, head_size=64, dtype="float16")
    runner = cuda_runner([layer], "GPU_REFERENCE")
    k_view, v_view = runner.kv_cache("attn")
    k_cache, v_cache = torch.from_dlpack(k_view), torch.from_dlpack(v_view)
    assert k_cache.is_cuda and k_cache.shape[2:] == (2, 64) and torch.isnan(k_cache).all()
    rng = np.random.default_rng(36)
    q, k, v = (on_gpu(random_values(rng, s, np.float16)) for s in ((3, 2, 64), (3, 2, 64), (3, 2, 64)))
    out = torch.full_like(q, float("nan"))
    runner.prepare_step([0], [3], [0], [[[5]]], order=runner.order_requests([0], [3]))
    with runner.forward():
        runner.attention("attn", q, k, v, out)
    torch.cuda.synchronize()
    block = 5 * (16 // runner.kv_cache_info("attn")["block_size"])
    torch.testing.assert_close(k_cache[block, :3], k, rtol=0, atol=0)
    torch.testing.assert_close(v_cache[block, :3], v, rtol=0, atol=0)


def test_wrong_device_tensors_are_refused_both_ways():
    layer = attnkit.LayerSpec("attn", num_q_heads=2, num_kv_heads=2, head_size=64, dtype="float16")
    rng = np.random.default_rng(37)
    arrays = [random_values(rng, s, np.float16) for s in ((3, 2, 64),) * 3]
    out = np.full((3, 2, 64), np.nan, np.float16)
    gpu = cuda_runner([layer], "VARLEN")
    gpu.prepare_step([0], [3], [0], [[[1]]], order=gpu.order_requests([0], [3]))
    with gpu.forward():
        with pytest.raises(attnkit.Error):  # host arrays for a CUDA runner
            gpu.attention("attn", *arrays, out)
        with pytest.raises(attnkit.Error):  # a float32 output on the device
            gpu.attention("attn", *(on_gpu(a) for a in arrays), on_gpu(out.astype(np.float32)))
    cfg = attnkit.RunnerConfig(platform="cpu", backend="VARLEN", max_num_reqs=4, max_num_tokens=8, max_model_len=32,
                               num_blocks=4)
    cpu = attnkit.ModelRunner([layer], cfg)
    cpu.prepare_step([0], [3], [0], [[[1]]], order=cpu.order_requests([0], [3]))
    with cpu.forward():
        with pytest.raises(attnkit.Error):  # CUDA tensors for a CPU runner
            cpu.attention("attn", *(on_gpu(a) for a in arrays), on_gpu(out))
    assert np.isnan(out).all()


def test_replay_on_the_gpu(tmp_path):
    from test_replay import expected, write_record

    batch, *arrays = write_record(tmp_path, np.random.default_rng(38))
    result = attnkit.replay(str(tmp_path), platform="cuda", lse=True)
    assert result["platform"].startswith("cuda") and result["backend"] == attnkit.priority_list("cuda")[0]
    want_out, want_lse = expected(batch, *arrays)
    np.testing.assert_allclose(result["out"], want_out, rtol=3e-3, atol=3e-3)
    np.testing.assert_allclose(result["lse"], want_lse, rtol=1e-4, atol=2e-3)


def test_cupy_arrays_on_a_cupy_stream():
    cupy = pytest.importorskip("cupy", reason="CuPy is the other DLPack producer the binding takes on the GPU")
    layer = attnkit.LayerSpec("attn", num_q_heads=8, num_kv_heads=2, head_size=128, dtype="float16")
    runner = cuda_runner([layer], "VARLEN")
    rng = np.random.default_rng(39)
    host = [random_values(rng, s, np.float16) for s in ((9, 8, 128), (9, 2, 128), (9, 2, 128))]
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        q, k, v = (cupy.asarray(a) for a in host)
        out = cupy.full((9, 8, 128), cupy.nan, dtype=cupy.float16)
        lse = cupy.full((9, 8), cupy.nan, dtype=cupy.float32)
    runner.prepare_step([0, 1], [4, 5], [0, 0], [[[2], [6]]], stream=stream.ptr, order=runner.order_requests([0, 1], [4, 5]))
    with runner.forward():
        runner.attention("attn", q, k, v, out, lse, stream=stream.ptr)
    stream.synchronize()
    got, got_lse = cupy.asnumpy(out), cupy.asnumpy(lse)
    assert not np.isnan(got).any() and not np.isnan(got_lse).any()
    for a, b in ((0, 4), (4, 9)):
        want, want_lse = brute_force_attention(host[0][a:b], host[1][a:b], host[2][a:b], 0)
        np.testing.assert_allclose(got[a:b], want, rtol=3e-3, atol=3e-3)
        np.testing.assert_allclose(got_lse[a:b], want_lse, rtol=1e-4, atol=2e-3)
