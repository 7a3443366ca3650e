"""attnkit.replay: a batch record (docs/replay-format.md) written here with NumPy, replayed on each
CPU backend, checked against the brute-force attention; bad records raise attnkit.Error."""

import json
import math

import numpy as np
import pytest

import attnkit
from engine_sim import brute_force_attention, random_values

PAGE = 16


def write_record(directory, rng, *, dtype="float16", requests=((1, 40), (6, 6), (3, 35)), window=None,
                 q_heads=8, kv_heads=2, head_size=64, extra=None):
    """A mixed batch (decode, prefill, extend) with random context in the cache files."""
    num_blocks = 1 + sum(math.ceil(s / PAGE) for _, s in requests)
    ids = list(rng.permutation(np.arange(1, num_blocks)))
    reqs = []
    for query_len, seq_len in requests:
        n = math.ceil(seq_len / PAGE)
        reqs.append({"query_len": query_len, "seq_len": seq_len, "blocks": [int(b) for b in ids[:n]]})
        ids = ids[n:]
    tokens = sum(q for q, _ in requests)
    np_dtype = np.float16 if dtype == "float16" else np.float32
    q = random_values(rng, (tokens, q_heads, head_size), np_dtype)
    k = random_values(rng, (tokens, kv_heads, head_size), np_dtype)
    v = random_values(rng, (tokens, kv_heads, head_size), np_dtype)
    k_cache = random_values(rng, (num_blocks, PAGE, kv_heads, head_size), np_dtype)
    v_cache = random_values(rng, (num_blocks, PAGE, kv_heads, head_size), np_dtype)
    batch = {"page_size": PAGE, "num_q_heads": q_heads, "num_kv_heads": kv_heads, "head_size": head_size,
             "dtype": dtype, "kv_dtype": dtype, "causal": True, "sliding_window": window, "soft_cap": None,
             "scale": None, "requests": reqs}
    batch.update(extra or {})
    (directory / "batch.json").write_text(json.dumps(batch))
    for name, a in (("q", q), ("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        np.save(directory / f"{name}.npy", a)
    return batch, q, k, v, k_cache, v_cache


def expected(batch, q, k, v, k_cache, v_cache):
    outs, lses = [], []
    start = 0
    for r in batch["requests"]:
        n, seq = r["query_len"], r["seq_len"]
        ctx = seq - n
        pages = r["blocks"]
        ck = np.array([k_cache[pages[p // PAGE], p % PAGE] for p in range(ctx)]).reshape(ctx, *k.shape[1:])
        cv = np.array([v_cache[pages[p // PAGE], p % PAGE] for p in range(ctx)]).reshape(ctx, *v.shape[1:])
        o, l = brute_force_attention(q[start:start + n], np.concatenate([ck, k[start:start + n]]),
                                     np.concatenate([cv, v[start:start + n]]), ctx, window=batch["sliding_window"])
        outs.append(o)
        lses.append(l)
        start += n
    return np.concatenate(outs), np.concatenate(lses)


@pytest.mark.parametrize("backend", ["REFERENCE", "VARLEN", "CSR_PLAN", None])
def test_replay_matches_brute_force(tmp_path, backend):
    batch, *arrays = write_record(tmp_path, np.random.default_rng(21), window=24)
    result = attnkit.replay(str(tmp_path), backend=backend, platform="cpu", lse=True)
    assert result["backend"] == (backend or attnkit.priority_list("cpu")[0])
    assert result["num_requests"] == 3 and result["num_tokens"] == 10 and result["invariants_checked"]
    want_out, want_lse = expected(batch, *arrays)
    assert result["out"].dtype == np.float32 and result["out"].shape == want_out.shape
    np.testing.assert_allclose(result["out"], want_out, rtol=3e-3, atol=3e-3)
    np.testing.assert_allclose(result["lse"], want_lse, rtol=1e-4, atol=2e-3)
    assert result["metadata"]["backend"] == result["backend"]


def test_replay_writes_results_like_the_cli(tmp_path):
    record = tmp_path / "record"
    record.mkdir()
    write_record(record, np.random.default_rng(22), dtype="float32")
    out_dir = tmp_path / "results" / "nested"
    result = attnkit.replay(str(record), backend="REFERENCE", lse=False, out_dir=str(out_dir))
    assert result["platform"] == "cpu" and result["lse"] is None
    np.testing.assert_array_equal(np.load(out_dir / "out.npy"), result["out"])
    assert json.loads((out_dir / "metadata.json").read_text())["backend"] == "REFERENCE"
    assert not (out_dir / "lse.npy").exists()


def test_bad_record_names_the_field(tmp_path):
    write_record(tmp_path, np.random.default_rng(23), extra={"sliding_windw": 8})
    with pytest.raises(attnkit.Error) as info:
        attnkit.replay(str(tmp_path))
    assert "sliding_windw" in info.value.field + info.value.value


def test_unsupported_backend_for_the_record_is_a_selection_error(tmp_path):
    write_record(tmp_path, np.random.default_rng(24), dtype="float32")
    with pytest.raises(attnkit.SelectionError) as info:
        attnkit.replay(str(tmp_path), backend="VARLEN", platform="cpu")
    assert any(r["parameter"] == "dtype" for r in info.value.candidates[0]["reasons"])


def test_missing_record_is_an_error(tmp_path):
    with pytest.raises(attnkit.Error):
        attnkit.replay(str(tmp_path / "nothing"))
