"""D1 decode context parallelism from Python: the ranks of an attnkit.ContextParallelHub as threads.

Every rank runs the same random mixed steps (the same block tables and the same Q/K/V, drawn from
the same seed) in its own thread with its own ModelRunner; each stores its share of the KV and the
ranks' partial attentions are merged, so every rank's output must equal the whole attention, checked
against the brute force of engine_sim.py.
"""

import threading

import numpy as np
import pytest

import attnkit
from engine_sim import Engine

# Manager blocks of 64 tokens: each of up to 4 ranks stores 16 positions of every block, a page VARLEN
# takes (multiples of 16).
LAYERS = [
    attnkit.LayerSpec("layers.0.attn", num_q_heads=4, num_kv_heads=2, head_size=64, dtype="float16", block_size=64),
    attnkit.LayerSpec("layers.1.attn", num_q_heads=4, num_kv_heads=2, head_size=64, dtype="float16", block_size=64,
                      soft_cap=3.0, sinks=[0.5, -0.25, 1.0, 0.0]),
]


def rank_config(backend, size, rank, interleave, group):
    return attnkit.RunnerConfig(platform="cpu", backend=backend, max_num_reqs=8, max_num_tokens=64, max_model_len=96,
                                num_blocks=64, need_lse=True, context_parallel_size=size, context_parallel_rank=rank,
                                context_parallel_interleave=interleave, context_parallel_group=group)


def run_ranks(size, work):
    """Runs work(rank) in `size` threads; returns their results, re-raising the first failure."""
    results, errors = [None] * size, [None] * size

    def body(rank):
        try:
            results[rank] = work(rank)
        except BaseException as e:  # noqa: BLE001  (reported below, with the rank)
            errors[rank] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a rank hung"
    for rank, e in enumerate(errors):
        if e is not None:
            raise AssertionError(f"rank {rank} failed: {e!r}") from e
    return results


@pytest.mark.parametrize("backend,size,interleave", [("REFERENCE", 2, 1), ("VARLEN", 2, 8), ("VARLEN", 4, 4)])
def test_every_rank_computes_the_whole_attention(backend, size, interleave):
    hub = attnkit.ContextParallelHub(size)
    assert hub.size == size

    def rank(r):
        try:
            runner = attnkit.ModelRunner(LAYERS, rank_config(backend, size, r, interleave, hub.group(r)))
            engine = Engine(runner, LAYERS, np.float16, np.random.default_rng(31))
            for _ in range(4):
                for _ in range(2):
                    engine.add_request(int(engine.rng.integers(8, 60)))
                engine.step(engine.random_schedule(max_tokens=48))
            return engine.rows_checked
        except BaseException:
            hub.fail()  # a rank that stops for its own reason must not leave the others waiting
            raise

    checked = run_ranks(size, rank)
    assert checked[0] > 0 and all(c == checked[0] for c in checked)


def test_a_failing_rank_makes_the_others_raise_instead_of_waiting():
    hub = attnkit.ContextParallelHub(2)

    def rank(r):
        runner = attnkit.ModelRunner(LAYERS[:1], rank_config("REFERENCE", 2, r, 1, hub.group(r)))
        engine = Engine(runner, LAYERS[:1], np.float16, np.random.default_rng(5))
        engine.add_request(20)
        try:
            if r == 1:
                # Rank 1's step is malformed (two query lengths for one request): its prepare_step
                # raises and fails the hub by itself, so rank 0, waiting in its first layer's
                # all-gather, raises too instead of waiting forever.
                with pytest.raises(attnkit.Error):
                    runner.prepare_step([100], [20, 4], [0], [[[1]]], order=runner.order_requests([100], [20, 4]))
            else:
                with pytest.raises(attnkit.Error, match="context"):
                    engine.step([(100, 20)])
        except BaseException:
            hub.fail()  # only when the expected error did not come: the test fails instead of hanging
            raise
        return "raised"

    assert run_ranks(2, rank) == ["raised", "raised"]


def test_a_wrong_group_is_refused_naming_the_field():
    hub = attnkit.ContextParallelHub(2)
    with pytest.raises(attnkit.Error) as e:
        attnkit.ModelRunner(LAYERS, rank_config("REFERENCE", 2, 0, 1, hub.group(1)))  # says rank 0
    assert e.value.field == "context_parallel_group"
    with pytest.raises(attnkit.Error) as e:
        attnkit.ModelRunner(LAYERS, rank_config("REFERENCE", 2, 0, 1, None))
    assert e.value.field == "context_parallel_group"
    with pytest.raises(attnkit.Error) as e:
        attnkit.ModelRunner(LAYERS, rank_config("REFERENCE", 2, 0, 1, "rank 0"))
    assert e.value.field == "config.context_parallel_group"
    with pytest.raises(attnkit.Error) as e:
        hub.group(2)
    assert e.value.field == "context_parallel.rank"
    with pytest.raises(attnkit.Error) as e:
        attnkit.ContextParallelHub(0)
    assert e.value.field == "context_parallel.size"
    with pytest.raises(attnkit.Error) as e:
        attnkit.ContextParallelHub(2, platform="tpu")
    assert e.value.field == "platform"
    with pytest.raises(attnkit.Error) as e:
        attnkit.ModelRunner(LAYERS, rank_config("CSR_PLAN", 2, 0, 1, hub.group(0)))
    assert "context_parallel" in str(e.value)


def test_each_rank_budgets_its_share_of_the_kv_memory():
    one = attnkit.kv_blocks_for_memory_budget(LAYERS, 1 << 24)
    two = attnkit.kv_blocks_for_memory_budget(LAYERS, 1 << 24, context_parallel_size=2)
    assert two == 2 * one
