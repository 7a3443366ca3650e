"""Errors: every refusal of the library (and of the binding's argument checks) is an attnkit.Error,
a ValueError carrying field, value and allowed; wrong tensors are refused, never a crash."""

import numpy as np
import pytest

import attnkit
from engine_sim import random_values
from fake_dlpack import CUDA, FakeDeviceArray

LAYER = attnkit.LayerSpec("attn", num_q_heads=4, num_kv_heads=2, head_size=64, dtype="float16")


def cpu_runner(backend="REFERENCE", layers=(LAYER,)):
    cfg = attnkit.RunnerConfig(platform="cpu", backend=backend, max_num_reqs=4, max_num_tokens=32, max_model_len=64,
                               num_blocks=16, need_lse=True)
    return attnkit.ModelRunner(list(layers), cfg)


def prepared(runner, tokens=3):
    runner.prepare_step([0], [tokens], [0], [[[1]]], order=runner.order_requests([0], [tokens]))
    return runner


def tensors(rng, tokens=3, dtype=np.float16):
    q = random_values(rng, (tokens, 4, 64), dtype)
    k = random_values(rng, (tokens, 2, 64), dtype)
    v = random_values(rng, (tokens, 2, 64), dtype)
    out = np.full((tokens, 4, 64), np.nan, dtype)
    return q, k, v, out


def test_error_is_a_value_error_with_field_value_allowed():
    assert issubclass(attnkit.Error, ValueError)
    assert issubclass(attnkit.SelectionError, attnkit.Error)
    assert issubclass(attnkit.InvariantError, attnkit.Error)
    with pytest.raises(attnkit.Error) as info:
        cpu_runner(layers=[dict(name="attn", num_q_heads=4, num_kv_heads=2, head_size=64, dtype="float17")])
    e = info.value
    assert e.field == "layers[0].dtype"
    assert e.value == "float17"
    assert "float16" in e.allowed and "bfloat16" in e.allowed
    assert "float17" in str(e)


def test_unknown_spec_key_is_refused_not_ignored():
    with pytest.raises(attnkit.Error) as info:
        cpu_runner(layers=[dict(name="attn", num_q_heads=4, num_kv_heads=2, head_size=64, sliding_windw=8)])
    assert info.value.field == "layers[0] key"
    assert info.value.value == "sliding_windw"
    assert "sliding_window" in info.value.allowed


def test_library_errors_keep_their_fields():
    # Layer params and KV spec must agree: the library's own start-up check.
    bad = attnkit.LayerSpec("attn", num_q_heads=4, num_kv_heads=2, head_size=64, dtype="float16", block_size=0)
    with pytest.raises(attnkit.Error) as info:
        cpu_runner(layers=[bad])
    assert info.value.field and info.value.allowed
    runner = cpu_runner()
    with pytest.raises(attnkit.Error) as info:
        runner.kv_cache("no.such.layer")
    assert info.value.value == "no.such.layer"
    with pytest.raises(attnkit.Error) as info:
        runner.selection(5)
    assert info.value.field == "layer"


def test_attention_outside_a_forward_scope_is_an_error():
    runner = prepared(cpu_runner())
    q, k, v, out = tensors(np.random.default_rng(0))
    with pytest.raises(attnkit.Error):
        runner.attention("attn", q, k, v, out)


def test_step_in_the_wrong_order_names_the_request():
    runner = cpu_runner("CSR_PLAN")  # decodes first
    with pytest.raises(attnkit.Error) as info:
        runner.prepare_step([7, 8], [4, 1], [0, 10], [[[1], [2]]], order=runner.order_requests([7, 8], [4, 1]))
    assert "8" in info.value.value or "8" in str(info.value)


def test_wrong_dtype_tensor_is_refused():
    runner = prepared(cpu_runner())
    rng = np.random.default_rng(1)
    q, k, v, out = tensors(rng)
    with runner.forward():
        with pytest.raises(attnkit.Error) as info:  # float32 query for a float16 layer
            runner.attention("attn", q.astype(np.float32), k, v, out)
        assert "float32" in info.value.value and "float16" in info.value.allowed
        with pytest.raises(attnkit.Error) as info:  # float32 key/value
            runner.attention("attn", q, k.astype(np.float32), v.astype(np.float32), out)
        assert info.value.field == "key/value dtype"
        with pytest.raises(attnkit.Error) as info:  # integers are no activation dtype at all
            runner.attention("attn", q.astype(np.int32), k, v, out)
        assert info.value.field == "query dtype" and info.value.value == "int32"
        with pytest.raises(attnkit.Error) as info:  # float64 neither
            runner.attention("attn", q, k, v, out.astype(np.float64))
        assert info.value.field == "output dtype"
        runner.abandon_step()  # the layer never ran: give the step up, or leaving the scope raises
    assert np.isnan(out).all(), "a refused call writes nothing"


def test_wrong_shape_is_refused():
    runner = prepared(cpu_runner())
    q, k, v, out = tensors(np.random.default_rng(2))
    with runner.forward():
        with pytest.raises(attnkit.Error):  # one query head too few
            runner.attention("attn", q[:, :3], k, v, out)
        with pytest.raises(attnkit.Error):  # fewer rows than the step's tokens
            runner.attention("attn", q[:2], k[:2], v[:2], out[:2])
        with pytest.raises(attnkit.Error):  # more than 4 dimensions cannot be a TensorView
            runner.attention("attn", q.reshape(3, 4, 64, 1, 1), k, v, out)
        runner.abandon_step()


def test_strided_views_are_taken_as_they_are_not_copied():
    # A query that is a strided view (every other row of a larger array) is read in place; the
    # output written into a strided view lands in the parent array.
    runner = prepared(cpu_runner())
    rng = np.random.default_rng(4)
    q, k, v, out = tensors(rng)
    q_parent = random_values(rng, (6, 4, 64), np.float16)
    q_parent[::2] = q
    out_parent = np.full((6, 4, 64), np.nan, np.float16)
    with runner.forward():
        runner.attention("attn", q_parent[::2], k, v, out_parent[::2])
    runner2 = prepared(cpu_runner())
    with runner2.forward():
        runner2.attention("attn", q, k, v, out)
    np.testing.assert_array_equal(out_parent[::2], out)
    assert np.isnan(out_parent[1::2]).all()


def test_cuda_tensor_given_to_a_cpu_runner_is_refused():
    runner = prepared(cpu_runner())
    q, k, v, out = tensors(np.random.default_rng(3))
    with runner.forward():
        with pytest.raises(attnkit.Error) as info:
            runner.attention("attn", FakeDeviceArray(q, CUDA), k, v, out)
        assert "device" in info.value.value or "device" in str(info.value)
        with pytest.raises(attnkit.Error):
            runner.attention("attn", q, FakeDeviceArray(k, CUDA), FakeDeviceArray(v, CUDA), out)
        with pytest.raises(attnkit.Error):
            runner.attention("attn", q, k, v, FakeDeviceArray(out, CUDA))
        with pytest.raises(attnkit.Error) as info:  # a device type the binding does not know (Vulkan)
            runner.attention("attn", FakeDeviceArray(q, 7), k, v, out)
        assert info.value.field == "query device"
        runner.abandon_step()
    assert np.isnan(out).all()


def test_cuda_platform_without_a_gpu_is_an_error():
    if attnkit.cuda_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(attnkit.Error) as info:
        attnkit.ModelRunner([LAYER], attnkit.RunnerConfig(platform="cuda"))
    assert info.value.field == "config.platform" and info.value.value == "cuda"


def test_bad_step_arguments():
    runner = cpu_runner()
    with pytest.raises(attnkit.Error) as info:
        runner.prepare_step([0], [1.5], [0], [[[1]]], order=runner.order_requests([0], [1.5]))
    assert info.value.field == "query_lens[0]"
    with pytest.raises(attnkit.Error) as info:
        runner.prepare_step([0], [1], [0], [np.zeros((1, 2), np.float32)], order=runner.order_requests([0], [1]))
    assert info.value.field == "block_tables[0]"
    with pytest.raises(attnkit.Error):  # one table per KV group: this runner has one group
        runner.prepare_step([0], [1], [0], [[[1]], [[2]]], order=runner.order_requests([0], [1]))


def test_two_requests_writing_one_page_are_refused_with_the_checker_on():
    cfg = attnkit.RunnerConfig(platform="cpu", backend="REFERENCE", max_num_reqs=4, max_num_tokens=32,
                               max_model_len=64, num_blocks=16, check_invariants=True)
    runner = attnkit.ModelRunner([LAYER], cfg)
    runner.prepare_step([0, 1], [3, 2], [0, 0], [[[1], [2]]], order=runner.order_requests([0, 1], [3, 2]))  # a valid step passes the checker
    runner.abandon_step()  # its layers are not run here
    with pytest.raises(attnkit.Error) as info:  # two requests writing one block
        runner.prepare_step([0, 1], [3, 2], [0, 0], [[[1], [1]]], order=runner.order_requests([0, 1], [3, 2]))
    assert info.value.field == "block_tables[0]" and "one writer" in info.value.allowed


def test_argument_types_no_overload_takes_are_attnkit_errors_naming_the_call():
    # Issue 39: the binding's dispatch refused these with TypeError before any attnkit code ran.
    runner = cpu_runner()
    with pytest.raises(attnkit.Error) as info:
        runner.prepare_step(1, 2, 3, 4)
    assert info.value.field == "ModelRunner.prepare_step arguments"
    assert "int" in info.value.value and "prepare_step(" in info.value.allowed
    with pytest.raises(attnkit.Error) as info:
        attnkit.replay(5)
    assert info.value.field == "replay arguments" and info.value.value == "(int)"
    assert isinstance(info.value, ValueError)
    # The wrapped calls still work, and TypeErrors of another kind are not rewritten.
    assert [b["name"] for b in attnkit.backends()]
    prepared(cpu_runner())
