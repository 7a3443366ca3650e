"""The benchmarks' random inputs, as bench/bench_inputs.h defines them for the C++ bench: functions of
(workload name, tensor, logical position) only, so bench/peers.py runs every Python peer on the same
queries, keys, values and block tables as bench/attention_bench.cc runs attnkit's backends.
tests/python/test_bench_inputs.py and tests/bench/bench_inputs_test.cc pin the same values.

Streams: queries [sum of query_len, q heads, head size] and keys / values [sum of seq_len, KV heads,
head size], packed in the workload file's request order; element i of a stream is uniform_at(seed, i).
Block tables: block_permutation(seed_of(name, BLOCK_SALT), num_blocks) taken in the runner's order.

uniform() works on int64 index arrays of NumPy or PyTorch (CPU or CUDA): both wrap on overflow, and
the logical shifts splitmix64 needs are arithmetic shifts masked to the bits a logical shift keeps.
"""

from __future__ import annotations

MASK64 = (1 << 64) - 1
KEY_SALT, BLOCK_SALT, QUERY_SALT, VALUE_SALT = 1, 2, 3, 4

_GAMMA = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_INDEX = 0xD1B54A32D192ED03


def splitmix64(x: int) -> int:
    x = (x + _GAMMA) & MASK64
    x = ((x ^ (x >> 30)) * _MIX1) & MASK64
    x = ((x ^ (x >> 27)) * _MIX2) & MASK64
    return x ^ (x >> 31)


def seed_of(name: str, salt: int) -> int:
    """FNV-1a of the workload name, the tensor's salt, mixed (bench_inputs.h seed_of)."""
    h = 1469598103934665603
    for ch in name.encode():
        h = ((h ^ ch) * 1099511628211) & MASK64
    return splitmix64(h ^ salt)


def block_permutation(seed: int, n: int) -> list[int]:
    """Fisher-Yates from the end: position i swapped with splitmix64(seed ^ i) % (i + 1)."""
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        j = splitmix64(seed ^ i) % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(x, k: int):
    return (x >> k) & ((1 << (64 - k)) - 1)


def uniform_bits(index, seed: int):
    """The 24 random bits of elements `index` (an int64 array) of stream `seed`."""
    x = (index * _signed(_INDEX)) ^ _signed(seed)
    x = x + _signed(_GAMMA)
    x = (x ^ _shr(x, 30)) * _signed(_MIX1)
    x = (x ^ _shr(x, 27)) * _signed(_MIX2)
    x = x ^ _shr(x, 31)
    return _shr(x, 40)


def uniform(index, seed: int, lo: float, hi: float, to_float32):
    """Elements `index` of stream `seed` as float32 values in [lo, hi): lo + (hi - lo) * u with
    u = bits / 2^24, in float32 like the C++ bench. to_float32 converts the int64 array."""
    u = to_float32(uniform_bits(index, seed)) * (1.0 / 16777216.0)
    return lo + (hi - lo) * u
