"""bench/bench_inputs.py: the Python peers' inputs are the C++ bench's. The values below are
bench/bench_inputs.h's (tests/bench/bench_inputs_test.cc pins the same ones), so either language
drifting from the other fails a test."""

import os
import struct
import sys
from pathlib import Path

import numpy as np

SOURCE = Path(os.environ.get("ATTNKIT_SOURCE_DIR", Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(SOURCE / "bench"))

import bench_inputs as bi  # noqa: E402

KEY_SEED = 0xF6F9293C1B8FB0EC  # seed_of("decode_64x4096", KEY_SALT)
# Elements 0, 1, 12345 and 2^33 of that key stream in [-1, 1], as float32 bit patterns.
KEY_VALUES = {0: 0xBD6B8140, 1: 0x3EC4CA38, 12345: 0xBEEC5814, 1 << 33: 0x3F2CA0D2}


def bits_of(x):
    return struct.unpack("<I", struct.pack("<f", float(x)))[0]


def test_seeds_are_the_cpp_benchs():
    assert bi.seed_of("decode_64x4096", bi.KEY_SALT) == KEY_SEED
    assert bi.seed_of("prefill_1x4096", bi.QUERY_SALT) == 0x3F8AD6863BAF3FEE


def test_stream_values_are_the_cpp_benchs_bit_for_bit():
    index = np.array(list(KEY_VALUES), dtype=np.int64)
    values = bi.uniform(index, KEY_SEED, -1.0, 1.0, lambda a: a.astype(np.float32))
    assert values.dtype == np.float32
    assert [bits_of(v) for v in values] == list(KEY_VALUES.values())


def test_values_cover_the_range_without_bias():
    values = bi.uniform(np.arange(200_000, dtype=np.int64), KEY_SEED, -1.0, 1.0, lambda a: a.astype(np.float32))
    assert values.min() >= -1.0 and values.max() < 1.0
    assert abs(float(values.mean())) < 0.01
    assert abs(float(values.std()) - 1 / np.sqrt(3)) < 0.01


def test_block_permutation_is_the_cpp_benchs():
    perm = bi.block_permutation(bi.seed_of("decode_64x4096", bi.BLOCK_SALT), 12)
    assert perm == [9, 10, 1, 11, 0, 4, 2, 8, 5, 6, 7, 3]
    big = bi.block_permutation(7, 5000)
    assert sorted(big) == list(range(5000)) and big != list(range(5000))
