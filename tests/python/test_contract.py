"""The engine-facing contract from Python: the classes of the misuse trial that crashed or gave a
silently wrong answer through the binding are errors now, or safe by construction."""

import threading

import numpy as np
import pytest

import attnkit
from engine_sim import random_values

LAYERS = [attnkit.LayerSpec("attn.0", num_q_heads=4, num_kv_heads=2, head_size=64, dtype="float16"),
          attnkit.LayerSpec("attn.1", num_q_heads=4, num_kv_heads=2, head_size=64, dtype="float16")]


def runner(backend="REFERENCE", layers=LAYERS):
    cfg = attnkit.RunnerConfig(platform="cpu", backend=backend, max_num_reqs=4, max_num_tokens=32, max_model_len=64,
                               num_blocks=16)
    return attnkit.ModelRunner(list(layers), cfg)


def io(tokens, seed=0):
    rng = np.random.default_rng(seed)
    q = random_values(rng, (tokens, 4, 64), np.float16)
    k = random_values(rng, (tokens, 2, 64), np.float16)
    v = random_values(rng, (tokens, 2, 64), np.float16)
    return q, k, v, np.full((tokens, 4, 64), np.nan, np.float16)


def test_a_kv_cache_view_outlives_close():
    r = runner()
    k, v = r.kv_cache("attn.0")
    r.close()
    assert np.isnan(k).all() and k.shape == (16, 16, 2, 64), "the view still reads the (poisoned) cache"
    k[0, 0, 0, 0] = 1.0  # and may be written: the memory is alive as long as the array
    with pytest.raises(attnkit.Error) as info:
        r.kv_cache("attn.0")
    assert info.value.field == "runner" and info.value.value == "closed"


def test_an_open_scope_outlives_close():
    r = runner()
    order = r.order_requests([0], [2])
    r.prepare_step([0], [2], [0], [[[1]]], order=order)
    with pytest.raises(attnkit.Error) as info:
        with r.forward():
            r.close()  # the scope holds the runner: leaving it reads live memory, never freed memory
    assert info.value.field == "forward scope"  # and still says the layers never ran


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_block_tables_padded_with_minus_one(dtype):
    r = runner()
    order = r.order_requests([0, 1], [3, 1])
    table = np.array([[1, -1, -1], [2, 3, -1]], dtype)  # request 1 has 17 tokens: two blocks
    r.prepare_step([0, 1], [3, 1], [0, 16], [table], order=order)
    r.abandon_step()
    bad = np.array([[1, -1, -1], [2, -1, -1]], dtype)  # request 1 needs its second block
    with pytest.raises(attnkit.Error) as info:
        r.prepare_step([0, 1], [3, 1], [0, 16], [bad], order=order)
    assert info.value.field == "block_tables[0] entry of request 1" and info.value.value == "-1"


def test_a_step_needs_its_order_and_follows_it():
    r = runner("CSR_PLAN")
    order = r.order_requests([7, 8], [4, 1])
    assert list(order) == [1, 0] and order.request_ids == [8, 7]
    with pytest.raises(attnkit.Error) as info:
        r.prepare_step([8, 7], [1, 4], [10, 0], [[[2], [1]]], order=None)
    assert info.value.field == "order"
    with pytest.raises(attnkit.Error) as info:  # the scheduler's order, not the runner's
        r.prepare_step([7, 8], [4, 1], [0, 10], [[[1], [2]]], order=order)
    assert info.value.field == "request order"
    r.prepare_step(order.request_ids, order.query_lens, [10, 0], [[[2], [1]]], order=order)


def test_every_layer_once_per_step():
    r = runner()
    q, k, v, out = io(3)
    order = r.order_requests([0], [3])
    r.prepare_step([0], [3], [0], [[[1]]], order=order)
    with pytest.raises(attnkit.Error) as info:
        with r.forward():
            r.attention("attn.0", q, k, v, out)
    assert info.value.field == "forward scope" and "attn.1" in info.value.value
    with pytest.raises(attnkit.Error) as info:
        r.prepare_step([0], [1], [3], [[[1]]], order=r.order_requests([0], [1]))
    assert info.value.field == "step"
    r.abandon_step()
    r.prepare_step([0], [3], [0], [[[1]]], order=order)
    with r.forward():
        r.attention("attn.0", q, k, v, out)
        with pytest.raises(attnkit.Error) as info:
            r.attention("attn.0", q, k, v, out)
        assert info.value.field == "layer" and info.value.value == "attn.0"
        r.attention("attn.1", q, k, v, out)


def test_a_runner_driven_from_two_threads_is_refused():
    r = runner()
    order = r.order_requests([0], [3])
    r.prepare_step([0], [3], [0], [[[1]]], order=order)
    entered, release, errors = threading.Event(), threading.Event(), []

    def hold():
        with r.forward():
            entered.set()
            release.wait(10)
            q, k, v, out = io(3)
            for name in ("attn.0", "attn.1"):
                r.attention(name, q, k, v, out)

    t = threading.Thread(target=hold)
    t.start()
    assert entered.wait(10)
    try:
        with pytest.raises(attnkit.Error) as info:
            r.prepare_step([0], [1], [3], [[[1]]], order=r.order_requests([0], [1]))
        errors.append(info.value.field)
    finally:
        release.set()
        t.join(10)
    assert errors == ["thread"]


def test_fp8_scales_must_be_set():
    layer = attnkit.LayerSpec("attn", num_q_heads=4, num_kv_heads=2, head_size=64, dtype="float16",
                              kv_cache_dtype="fp8_e4m3")
    with pytest.raises(attnkit.Error) as info:
        attnkit.ModelRunner([layer], attnkit.RunnerConfig(platform="cpu", backend="REFERENCE"))
    assert info.value.field == "k_scale"
    attnkit.ModelRunner([layer], attnkit.RunnerConfig(platform="cpu", backend="REFERENCE", k_scale=1.0, v_scale=1.0))
