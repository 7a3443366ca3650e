#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz (corpus/<target>/), which are committed: small valid
inputs of each target and a few near-misses, from which libFuzzer mutates. Standard library only.

    python3 tests/fuzz/make_seeds.py     # rewrites tests/fuzz/corpus/{npy,batch_record,prepare_step}

The prepare_step encoding is the one prepare_step_fuzz.cc's header describes; batch_record inputs
are batch.json and the five .npy files joined by the separator of batch_record_fuzz.cc.
"""
import json
import pathlib
import struct

HERE = pathlib.Path(__file__).resolve().parent
SEPARATOR = b"\n--attnkit-fuzz-file--\n"


def npy(shape, values=None, descr="<f4", version=1, fortran=False):
    """A .npy file as NumPy writes it (header padded to 64 bytes)."""
    dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }" % (descr, fortran, dims)
    preamble = 10 if version == 1 else 12
    header += " " * ((64 - (preamble + len(header) + 1) % 64) % 64) + "\n"
    length = struct.pack("<H" if version == 1 else "<I", len(header))
    count = 1
    for d in shape:
        count *= d
    if values is None:
        values = [((i * 7) % 11 - 5) / 4.0 for i in range(count)]
    fmt = {"<f4": "f", "<f2": "e"}.get(descr, "f")
    return b"\x93NUMPY" + bytes([version, 0]) + length + header.encode() + struct.pack("<%d%s" % (count, fmt), *values)


def npy_seeds():
    return {
        "f4_2x3": npy((2, 3)),
        "f2_vector": npy((4,), descr="<f2"),
        "f4_v2_header": npy((1, 2, 2), version=2),
        "f4_v3_header": npy((2, 1), version=3),
        "scalar": npy(()),
        "empty_rows": npy((0, 4)),
        "four_dims": npy((1, 2, 1, 2)),
        "five_dims": npy((1, 1, 1, 1, 2)),
        "int_descr": npy((2,), values=[0.0, 0.0], descr="<i4"),
        "fortran": npy((2, 2), fortran=True),
        "truncated": npy((2, 3))[:-5],
    }


def record(config, requests, num_blocks, tokens):
    """batch.json plus the five arrays of a record; shapes from the config."""
    page, kv_heads, q_heads, head = config["page_size"], config["num_kv_heads"], config["num_q_heads"], config["head_size"]
    body = dict(config, requests=requests)
    files = [
        npy((num_blocks, page, kv_heads, head)),  # k_cache
        npy((num_blocks, page, kv_heads, head)),  # v_cache
        npy((tokens, q_heads, head)),  # q
        npy((tokens, kv_heads, head)),  # k
        npy((tokens, kv_heads, head)),  # v
    ]
    return SEPARATOR.join([json.dumps(body, indent=1).encode()] + files)


def batch_record_seeds():
    base = {"page_size": 2, "num_q_heads": 2, "num_kv_heads": 1, "head_size": 2, "dtype": "float32",
            "kv_dtype": "float32", "causal": True, "sliding_window": None, "soft_cap": None, "scale": None}
    mixed = [{"query_len": 1, "seq_len": 3, "blocks": [0, 1]}, {"query_len": 2, "seq_len": 2, "blocks": [2]}]
    features = dict(base, kv_dtype="fp8_e4m3", k_scale=0.5, v_scale=2.0, sliding_window=2, soft_cap=30.0,
                    scale=0.5, sinks=[0.1, -0.2], alibi_slopes=[0.5, 0.25], causal=False, dtype="bfloat16")
    # Prefix caching: both requests read context page 0 at the same position.
    shared = [{"query_len": 1, "seq_len": 3, "blocks": [0, 1]}, {"query_len": 1, "seq_len": 4, "blocks": [0, 2]}]
    return {
        "mixed": record(base, mixed, 3, 3),
        "features": record(features, mixed, 3, 3),
        "shared_prefix": record(base, shared, 3, 2),
        "too_few_blocks": record(base, [{"query_len": 1, "seq_len": 5, "blocks": [0]}], 1, 1),
        "json_only": json.dumps(dict(base, requests=mixed)).encode(),
    }


def small_int(v):
    """FuzzInput::small_int's encoding."""
    if -16 <= v <= 223:
        return bytes([v + 16])
    if 0 <= v <= 0xFFFF:
        return bytes([0xF0]) + struct.pack("<H", v)
    return bytes([0xF8]) + struct.pack("<i", v)


def step(runner, flags, requests, tables, cpu=None, swap=(0, 0)):
    """requests: (id, query_len, computed) in the scheduler's order; tables: (row_stride, rows)."""
    out = bytes([runner, flags, len(requests)])
    for r in requests:
        out += b"".join(small_int(v) for v in r)
    if cpu is not None:
        out += b"".join(small_int(v) for v in cpu)
    out += bytes(swap)
    for stride, rows in tables:
        out += bytes([stride, 0]) + b"".join(small_int(v) for v in rows)
    return out


RUN, CPU, SWAP, NO_ORDER = 1 << 4, 1 << 3, 1 << 2, 1 << 0


def prepare_step_seeds():
    # Runners (prepare_step_fuzz.cc, runners()): 0 VARLEN page 16, 1 CSR_PLAN page 32, 2 REFERENCE
    # page 16 with the checker, 3 full + sliding window + recurrent (three groups), 4 VARLEN manager
    # block 64 of kernel pages 16. Requests: a decode of a long context and a prefill, scheduler order
    # prefill first (the runner moves decodes first).
    reqs = [(7, 5, 0), (3, 1, 20)]
    one_group = [(2, [4, 0, 3, 9])]
    return {
        "varlen_mixed": step(0, RUN, reqs, one_group),
        "varlen_prepare_only": step(0, 0, reqs, one_group),
        "csr_plan_mixed": step(1, RUN, reqs, [(1, [4, 3])]),
        "reference_checked": step(2, RUN, reqs, one_group),
        "hybrid_three_groups": step(3, RUN, reqs, [(2, [4, 0, 3, 9]), (2, [6, 0, 5, 8]), (1, [1, 2])]),
        "hybrid_upper_bounds": step(3, RUN | CPU, reqs, [(2, [4, 0, 3, 9]), (2, [6, 0, 5, 8]), (1, [1, 2])],
                                    cpu=[0, 22]),
        "expanded_pages": step(4, RUN, [(1, 40, 30), (2, 1, 100)], [(2, [5, 6, 7, 8])]),
        "shared_prefix": step(4, RUN, [(1, 1, 70), (2, 1, 80)], [(2, [5, 6, 5, 8])]),
        "out_of_order": step(0, RUN | SWAP, reqs + [(9, 1, 3)], [(2, [4, 0, 3, 9, 10, 0])], swap=(0, 1)),
        "no_order": step(0, NO_ORDER, reqs, one_group),
    }


def main():
    for target, seeds in (("npy", npy_seeds()), ("batch_record", batch_record_seeds()),
                          ("prepare_step", prepare_step_seeds())):
        folder = HERE / "corpus" / target
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        for name, data in seeds.items():
            (folder / name).write_bytes(data)
        print("%s: %d seeds" % (folder.relative_to(HERE.parent.parent), len(seeds)))


if __name__ == "__main__":
    main()
