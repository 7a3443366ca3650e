"""Selection from Python: the backend list with its capabilities, auto and explicit selection, and
every reason a backend is refused (S2/S3)."""

import pytest

import attnkit


def layer(**overrides):
    spec = dict(name="attn", num_q_heads=8, num_kv_heads=2, head_size=128, dtype="float16")
    spec.update(overrides)
    return spec


def test_backends_list_their_capabilities():
    caps = {b["name"]: b for b in attnkit.backends()}
    assert {"REFERENCE", "VARLEN", "CSR_PLAN", "RECURRENT_STATE"} <= set(caps)
    ref = caps["REFERENCE"]
    assert "float32" in ref["dtypes"] and "fp8_e4m3" in ref["kv_cache_dtypes"]
    assert ref["runs_here"] == "cpu" and ref["variants"] == ["cpu-exact-f64"]
    varlen = caps["VARLEN"]
    assert "float32" not in varlen["dtypes"] and 72 not in varlen["head_sizes"]
    assert "fused_hnd" in varlen["kv_layouts"] and varlen["cudagraph_support"] == "always"
    assert caps["CSR_PLAN"]["reorder_batch_threshold"] == 1
    assert caps["VARLEN"]["reorder_batch_threshold"] is None
    assert attnkit.priority_list("cpu")[:3] == ["VARLEN", "CSR_PLAN", "REFERENCE"]
    # Registered in every build; where it would run is this machine's answer.
    assert caps["GPU_REFERENCE"]["platforms"] == ["cuda"]
    assert attnkit.priority_list("cuda")[-1] == "GPU_REFERENCE"
    assert caps["GPU_REFERENCE"]["runs_here"] == ("cuda" if attnkit.cuda_available() else None)


def test_auto_takes_the_first_valid_backend_and_says_why_it_skipped_others():
    # float32 activations: VARLEN and CSR_PLAN take only 16-bit ones; REFERENCE runs it.
    sel = attnkit.select(layer(dtype="float32"), attnkit.RunnerConfig(platform="cpu"))
    assert sel.backend == "REFERENCE" and sel.variant == "cpu-exact-f64" and not sel.explicit
    assert [c["backend"] for c in sel.candidates] == ["VARLEN", "CSR_PLAN", "REFERENCE"]
    refused = sel.refused
    assert set(refused) == {"VARLEN", "CSR_PLAN"}
    for reasons in refused.values():
        dtype_reasons = [r for r in reasons if r["parameter"] == "dtype"]
        assert dtype_reasons and dtype_reasons[0]["value"] == "float32"
        assert dtype_reasons[0]["kind"] == "feature" and "float16" in dtype_reasons[0]["supported"]
    assert "REFERENCE" in sel.log_line and "skipped" in sel.log_line


def test_explicit_backend_that_cannot_run_fails_with_every_reason():
    with pytest.raises(attnkit.SelectionError) as info:
        attnkit.select(layer(head_size=80, dtype="float32"), attnkit.RunnerConfig(platform="cpu", backend="CSR_PLAN"))
    e = info.value
    assert e.field == "backend" and e.value == "CSR_PLAN"
    assert "REFERENCE" in e.allowed  # the registered backend that would accept it
    (candidate,) = e.candidates
    assert candidate["backend"] == "CSR_PLAN" and not candidate["valid"]
    params = {r["parameter"]: r for r in candidate["reasons"]}
    assert params["head_size"]["value"] == "80" and "128" in params["head_size"]["supported"]
    assert params["dtype"]["value"] == "float32"
    assert "never replaced" in str(e)


def test_explicit_choice_is_never_swapped():
    sel = attnkit.select(layer(), {"platform": "cpu", "backend": "REFERENCE"})
    assert sel.backend == "REFERENCE" and sel.explicit
    assert [c["backend"] for c in sel.candidates] == ["REFERENCE"]
    # A layer's own backend overrides the config's.
    sel = attnkit.select(layer(backend="CSR_PLAN"), {"platform": "cpu", "backend": "REFERENCE"})
    assert sel.backend == "CSR_PLAN"


def test_unknown_backend_lists_the_registered_ones():
    with pytest.raises(attnkit.SelectionError) as info:
        attnkit.select(layer(), attnkit.RunnerConfig(backend="FLASH_MAGIC"))
    assert info.value.value == "FLASH_MAGIC"
    assert "VARLEN" in str(info.value)


def test_feature_and_combination_reasons():
    # CSR_PLAN: no ALiBi; sliding window + sinks is a combination its decode plan lacks.
    with pytest.raises(attnkit.SelectionError) as info:
        attnkit.select(layer(sliding_window=16, sinks=[0.5] * 8, alibi_slopes=[0.1] * 8),
                       attnkit.RunnerConfig(backend="CSR_PLAN"))
    kinds = {r["kind"] for r in info.value.candidates[0]["reasons"]}
    assert "feature" in kinds and "combination" in kinds


def test_selection_for_cuda_without_a_gpu_uses_the_described_device():
    sel = attnkit.select(layer(), attnkit.RunnerConfig(platform="cuda", compute_capability=90))
    if attnkit.built_with_cuda:
        assert sel.backend == "VARLEN"
    # sm_80 is outside every CUDA kernel's range: the hardware reason is reported.
    if not attnkit.cuda_available():
        with pytest.raises(attnkit.SelectionError) as info:
            attnkit.select(layer(), attnkit.RunnerConfig(platform="cuda", compute_capability=80, backend="VARLEN"))
        kinds = [r["kind"] for r in info.value.candidates[0]["reasons"]]
        assert "hardware" in kinds


def test_runner_selection_matches_select_and_the_log():
    lines = []
    cfg = attnkit.RunnerConfig(platform="cpu", max_num_reqs=4, max_num_tokens=32, max_model_len=64, num_blocks=8)
    layers = [layer(name="a"), layer(name="b", dtype="float32")]
    runner = attnkit.ModelRunner(layers, cfg, log=lines.append)
    assert runner.layer_names == ["a", "b"] and runner.num_layers == 2
    assert runner.selection("a").backend == attnkit.select(layers[0], cfg).backend == "VARLEN"
    assert runner.selection(1).backend == "REFERENCE"
    assert any(l.startswith("attention backend VARLEN") for l in lines)
    assert any(l.startswith("attention backend REFERENCE") for l in lines)
    assert any(l.startswith("kv group") for l in lines)


def test_select_names_the_layer_in_its_errors():
    with pytest.raises(attnkit.Error) as info:
        attnkit.select(layer(head_sz=64))
    assert info.value.field == "layer key" and info.value.value == "head_sz"
    with pytest.raises(attnkit.Error) as info:
        attnkit.select(layer(num_q_heads="eight"))
    assert info.value.field == "layer.num_q_heads" and "an integer" in info.value.allowed
