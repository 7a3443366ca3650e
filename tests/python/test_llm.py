"""attnkit.LLM: the serving engine from Python (issue 33 §7), on the CPU with a tiny random model.

Each request's tokens, greedy or seeded sampling, must not depend on the requests it is batched
with: the batch's results are compared with each prompt generated alone. Prefix caching reports hits on a shared
prompt and changes no token; a bad request refuses the whole call, naming the prompt and the field.
"""

import os
import pathlib
import subprocess

import numpy as np
import pytest

import attnkit


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    cli = os.environ.get("ATTNKIT_CLI")
    if not cli or not pathlib.Path(cli).exists():
        pytest.fail("ATTNKIT_CLI (the attnkit program, set by ctest) is needed to make the test model")
    folder = tmp_path_factory.mktemp("llm") / "qwen3-tiny"
    subprocess.run([cli, "make-model", "--family", "qwen3", "--size", "tiny", "--seed", "5", "--dtype", "fp32",
                    str(folder)], check=True, capture_output=True)
    return str(folder)


def prompts_of(seed, lengths, vocab=256):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, size=n).tolist() for n in lengths]


def make_llm(model_dir, **kw):
    args = dict(platform="cpu", max_num_seqs=4, max_num_batched_tokens=32, max_model_len=128, kv_memory_mb=4)
    args.update(kw)
    return attnkit.LLM(model_dir, **args)


def test_batched_generation_equals_each_prompt_alone(model_dir):
    llm = make_llm(model_dir)
    prompts = prompts_of(1, [5, 40, 17, 9, 23])
    params = attnkit.SamplingParams(max_tokens=12, ignore_eos=True)
    together = llm.generate(prompts, params)
    assert [c.prompt_token_ids for c in together] == prompts
    for prompt, completion in zip(prompts, together):
        alone = llm.generate([prompt], params)[0]
        assert completion.token_ids == alone.token_ids
        assert len(completion.token_ids) == 12 and completion.finish_reason == "length"
    # 40 tokens over a budget of 32: the long prompt ran in chunks, and 5 prompts over 4 slots queued.
    assert llm.last_run()["steps"] >= 12


def test_prefix_caching_hits_and_changes_no_token(model_dir):
    system = prompts_of(2, [48])[0]
    prompts = [system + tail for tail in prompts_of(3, [6, 11, 3])]
    params = attnkit.SamplingParams(max_tokens=8, ignore_eos=True)
    cached = make_llm(model_dir, enable_prefix_caching=True)
    cached.generate(prompts[:1], params)  # fills the cache with the shared prompt's full blocks
    with_cache = cached.generate(prompts, params)
    hits = cached.last_run()
    assert hits["prefix_hit_tokens"] > 0 and hits["prefix_queried_tokens"] > 0
    plain = make_llm(model_dir, enable_prefix_caching=False)
    without = plain.generate(prompts, params)
    assert plain.last_run()["prefix_hit_tokens"] == 0
    assert [c.token_ids for c in with_cache] == [c.token_ids for c in without]


def test_sampling_is_seeded_per_request(model_dir):
    llm = make_llm(model_dir)
    prompts = prompts_of(4, [7, 7])
    sampled = attnkit.SamplingParams(max_tokens=10, temperature=1.0, top_k=20, top_p=0.9, seed=9, ignore_eos=True)
    first = llm.generate(prompts, [sampled, attnkit.SamplingParams(max_tokens=4, ignore_eos=True)])
    again = llm.generate([prompts[0]], sampled)
    assert first[0].token_ids == again[0].token_ids
    assert len(first[1].token_ids) == 4


def test_sampled_requests_do_not_depend_on_their_batch(model_dir):
    # Each token is drawn on the step's platform from the request's seed and its number of generated
    # tokens, so a sampled request gets the same tokens alone, beside other sampled requests, and
    # after them in a second call; another seed gives another stream.
    prompts = prompts_of(6, [8, 30, 5])
    params = [attnkit.SamplingParams(max_tokens=12, temperature=t, top_k=k, top_p=p, seed=s, ignore_eos=True)
              for t, k, p, s in [(0.9, 0, 1.0, 1), (1.2, 30, 0.95, 2), (0.7, 8, 0.8, 3)]]
    llm = make_llm(model_dir)
    together = [c.token_ids for c in llm.generate(prompts, params)]
    alone = [llm.generate([prompt], p)[0].token_ids for prompt, p in zip(prompts, params)]
    assert together == alone
    greedy = llm.generate([prompts[0]], attnkit.SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids
    assert together[0] != greedy
    other = attnkit.SamplingParams(max_tokens=12, temperature=0.9, seed=99, ignore_eos=True)
    assert llm.generate([prompts[0]], other)[0].token_ids != together[0]


def test_stop_token_ends_a_request(model_dir):
    llm = make_llm(model_dir)
    prompt = prompts_of(5, [9])[0]
    free = llm.generate([prompt], attnkit.SamplingParams(max_tokens=10, ignore_eos=True))[0].token_ids
    stop = free[3]
    cut = llm.generate([prompt], attnkit.SamplingParams(max_tokens=10, stop_token_ids=[stop], ignore_eos=True))[0]
    assert cut.token_ids == free[: free.index(stop) + 1]
    assert cut.finish_reason == "stop_token"


@pytest.mark.parametrize(
    "prompt, params, field",
    [
        ([], attnkit.SamplingParams(), "prompts[1].prompt"),
        ([1, 2, 100000], attnkit.SamplingParams(), "prompts[1].prompt[2]"),
        ([1, 2, 3], attnkit.SamplingParams(max_tokens=0), "prompts[1].max_tokens"),
        (list(range(3, 130)), attnkit.SamplingParams(max_tokens=8), "prompts[1].prompt + max_tokens"),
    ],
)
def test_bad_request_refuses_the_call_naming_the_field(model_dir, prompt, params, field):
    llm = make_llm(model_dir)
    good = prompts_of(6, [5])[0]
    with pytest.raises(attnkit.Error) as info:
        llm.generate([good, prompt], [attnkit.SamplingParams(max_tokens=3), params])
    assert info.value.field == field
    # Nothing was left queued: the next call runs alone and completes.
    assert len(llm.generate([good], attnkit.SamplingParams(max_tokens=3))[0].token_ids) <= 3


def test_bad_sampling_params_are_refused():
    with pytest.raises(attnkit.Error) as info:
        attnkit.SamplingParams(top_p=0.0)
    assert info.value.field == "top_p"
    with pytest.raises(attnkit.Error):
        attnkit.SamplingParams(temperature=-1.0)


def test_sampling_params_list_must_match_prompts(model_dir):
    llm = make_llm(model_dir)
    with pytest.raises(attnkit.Error) as info:
        llm.generate(prompts_of(7, [4, 4]), [attnkit.SamplingParams()])
    assert info.value.field == "sampling_params"


def test_async_scheduling_gives_the_tokens_of_synchronous_steps(model_dir):
    # On the CPU each step computes inside its launch, but the engine runs the async code path:
    # placeholders, device tokens, discarded work after a stop. The tokens must not change.
    prompts = prompts_of(8, [5, 40, 17, 9, 23])
    free = make_llm(model_dir).generate(prompts[:1], attnkit.SamplingParams(max_tokens=10, ignore_eos=True))[0]
    params = [attnkit.SamplingParams(max_tokens=12, ignore_eos=True) for _ in prompts]
    params[0] = attnkit.SamplingParams(max_tokens=10, stop_token_ids=[free.token_ids[4]], ignore_eos=True)
    params[3] = attnkit.SamplingParams(max_tokens=2, ignore_eos=True)
    sync = make_llm(model_dir, async_scheduling=False)
    overlapped = make_llm(model_dir, async_scheduling=True)
    assert not sync.async_scheduling and overlapped.async_scheduling
    assert not make_llm(model_dir).async_scheduling, "the CPU platform's default is off"
    want = sync.generate(prompts, params)
    got = overlapped.generate(prompts, params)
    assert [(c.token_ids, c.finish_reason) for c in got] == [(c.token_ids, c.finish_reason) for c in want]
    assert got[0].finish_reason == "stop_token"
    assert sync.last_run()["overlapped_steps"] == 0
    assert overlapped.last_run()["overlapped_steps"] > 0


def nan_token_model(tmp_path, token):
    """A tiny Llama (untied LM head) whose embedding row `token` is NaN: a request reading it fails."""
    import json
    import struct

    cli = os.environ["ATTNKIT_CLI"]
    folder = tmp_path / "llama-nan"
    subprocess.run([cli, "make-model", "--family", "llama", "--size", "tiny", "--seed", "6", "--dtype", "fp32",
                    str(folder)], check=True, capture_output=True)
    path = folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    (length,) = struct.unpack("<Q", bytes(data[:8]))
    entry = json.loads(bytes(data[8:8 + length]))["model.embed_tokens.weight"]
    assert entry["dtype"] == "F32"
    hidden = entry["shape"][1]
    start = 8 + length + entry["data_offsets"][0] + token * hidden * 4
    data[start:start + hidden * 4] = np.full(hidden, np.nan, np.float32).tobytes()
    path.write_bytes(bytes(data))
    return str(folder)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_failing_request_comes_back_marked_and_the_others_complete(tmp_path, async_scheduling):
    bad_token = 250
    model = nan_token_model(tmp_path, bad_token)
    params = attnkit.SamplingParams(max_tokens=6, ignore_eos=True)
    prompts = [p for p in prompts_of(11, [5, 20, 9], vocab=200)]  # ids below 200: never the bad token
    bad_prompt = prompts_of(12, [12], vocab=200)[0]
    bad_prompt[4] = bad_token
    with make_llm(model, async_scheduling=async_scheduling) as llm:
        alone = [llm.generate([p], params)[0] for p in prompts]
        if any(bad_token in c.token_ids for c in alone):
            pytest.skip("the model generates the bad token")
        out = llm.generate(prompts[:1] + [bad_prompt] + prompts[1:], params)
        assert out[1].finish_reason == "error" and "non-finite" in out[1].error and out[1].token_ids == []
        assert [c.token_ids for c in out[:1] + out[2:]] == [c.token_ids for c in alone]
        assert all(c.finish_reason == "length" and c.error == "" for c in out[:1] + out[2:])
        # The LLM serves the next call as before.
        assert llm.generate(prompts[:1], params)[0].token_ids == alone[0].token_ids
    assert llm.closed


def test_close_frees_the_engine_and_later_calls_raise(model_dir):
    llm = make_llm(model_dir)
    assert not llm.closed
    llm.close()
    llm.close()  # idempotent
    with pytest.raises(attnkit.Error) as info:
        llm.generate([[3, 4, 5]])
    assert info.value.field == "LLM" and info.value.value == "closed"
    with pytest.raises(attnkit.Error):
        _ = llm.backend


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(max_num_seqs="4"), "max_num_seqs"),
        (dict(max_num_seqs=4.0), "max_num_seqs"),
        (dict(platform=3), "platform"),
        (dict(backend=7), "backend"),
        (dict(enable_prefix_caching="yes"), "enable_prefix_caching"),
        (dict(capture_sizes="8"), "capture_sizes"),
        (dict(async_scheduling=1), "async_scheduling"),
        (dict(kv_memory_mb=None), "kv_memory_mb"),
    ],
)
def test_wrong_argument_types_are_attnkit_errors_naming_the_argument(model_dir, kwargs, field):
    with pytest.raises(attnkit.Error) as info:
        make_llm(model_dir, **kwargs)
    assert info.value.field == field


def test_wrong_types_in_generate_and_sampling_params_are_attnkit_errors(model_dir):
    with pytest.raises(attnkit.Error) as info:
        attnkit.LLM(42)
    assert info.value.field == "model_dir"
    for kwargs, field in [(dict(max_tokens="3"), "max_tokens"), (dict(temperature="hot"), "temperature"),
                          (dict(seed=-1), "seed"), (dict(ignore_eos=1), "ignore_eos"),
                          (dict(stop_token_ids=[1, "a"]), "stop_token_ids"),
                          (dict(stop_sequences=[[1], "ab"]), "stop_sequences[1]")]:
        with pytest.raises(attnkit.Error) as info:
            attnkit.SamplingParams(**kwargs)
        assert info.value.field.startswith(field), (kwargs, info.value.field)
    llm = make_llm(model_dir)
    for prompts, params, field in [("abc", None, "prompts"), ([[3, 4], "x"], None, "prompts[1]"),
                                   ([[3, 4]], "greedy", "sampling_params"), ([[3, 4]], [3], "sampling_params[0]")]:
        with pytest.raises(attnkit.Error) as info:
            llm.generate(prompts, params)
        assert info.value.field.startswith(field), (prompts, params, info.value.field)


def test_speculative_decoding_gives_the_tokens_of_plain_decoding(model_dir):
    span = prompts_of(13, [6])[0]
    prompts = [prompts_of(14, [3])[0] + span * 4, span * 5 + span[:2]]
    params = [attnkit.SamplingParams(max_tokens=16, ignore_eos=True),
              attnkit.SamplingParams(max_tokens=16, temperature=0.8, top_k=10, seed=4, ignore_eos=True)]
    plain = make_llm(model_dir).generate(prompts, params)
    llm = make_llm(model_dir, num_draft_tokens=4)
    spec = llm.generate(prompts, params)
    assert [c.token_ids for c in spec] == [c.token_ids for c in plain]
    run = llm.last_run()
    assert run["verifications"] > 0 and run["acceptance_length"] >= 1.0
    with pytest.raises(attnkit.Error) as info:
        make_llm(model_dir, num_draft_tokens=99)
    assert info.value.field == "speculative.num_draft_tokens"
