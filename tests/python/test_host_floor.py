"""bench/host_floor.py: a host time quoted against the GPU floor of the step it prepares, from the
ceilings measured in the same run, with the floor worked out by hand."""

import json
import os
import sys
from pathlib import Path

import pytest

SOURCE = Path(os.environ.get("ATTNKIT_SOURCE_DIR", Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(SOURCE / "bench"))

import host_floor  # noqa: E402


def bench(name, host_us, reqs, groups, short, **extra):
    b = {"name": name, "run_type": "iteration", "real_time": host_us, "time_unit": "us", "reqs": reqs,
         "kv_groups": groups, "short_context": short}
    b.update(extra)
    return b


def test_a_decode_step_is_quoted_against_its_bandwidth_floor(tmp_path):
    # 64 requests seeing 4096 keys each: per layer 64 x 4096 x 8 x 128 x 2 x 2 bytes = 1073.7 MB, at
    # 4 TB/s 268.4 us, 32 layers 8589.9 us; the matrix term (4 x 128 x 32 x 262144 FLOPs at 800
    # TFLOP/s, 5.4 us per layer) is smaller.
    report = {"context": {"date": "d", "copy_tb_per_s": "4.0", "bf16_gemm_tflop_per_s": "800"},
              "benchmarks": [bench("host_step_cuda/X/reqs:64/groups:1/short:0", 42.95, 64, 1, 0,
                                   kv_tokens=64 * 4096.0)]}
    path = tmp_path / "host.json"
    path.write_text(json.dumps(report))
    out = tmp_path / "host.md"
    host_floor.main([str(path), "--out", str(out)])
    text = out.read_text()
    assert "measured in the same run" in text
    row = next(line for line in text.splitlines() if line.startswith("| host_step_cuda/X"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "43.0" and cells[2] == "1073.7" and cells[3] == "8589.9"
    assert float(cells[4]) == pytest.approx(42.95 / 8589.93, rel=1e-3)


def test_ceilings_of_another_run_must_be_named_and_tokens_can_come_from_a_sibling(tmp_path):
    report = {"context": {"date": "d"}, "benchmarks": [bench("host_step_cuda/X/reqs:1/groups:3/short:1", 10.0, 1, 3, 1),
                                                          {"name": "host_step_cuda/Y/reqs:1/groups:3/short:1",
                                                           "run_type": "iteration", "error_occurred": True,
                                                           "error_message": "refused"}]}
    sibling = {"benchmarks": [bench("host_step/X/1/3/1", 1.0, 1, 3, 1, kv_tokens=33.0)]}
    path, sib = tmp_path / "host.json", tmp_path / "cpu.json"
    path.write_text(json.dumps(report))
    sib.write_text(json.dumps(sibling))
    with pytest.raises(SystemExit):
        host_floor.main([str(path)])  # no ceilings anywhere: refused, never a made-up floor
    out = tmp_path / "host.md"
    host_floor.main([str(path), "--copy-tbps", "4", "--gemm-tflops", "800", "--ceilings-from", "the step bench",
                     "--kv-tokens-from", str(sib), "--out", str(out)])
    text = out.read_text()
    assert "the step bench" in text
    floor = 32 * 33 * 8 * 128 * 2 * 2 / 4e12 * 1e6
    assert f"| {floor:.1f} |" in text
    assert "| host_step_cuda/Y/reqs:1/groups:3/short:1 | error: refused |" in text
