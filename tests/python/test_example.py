"""examples/python/engine_step.py runs and matches its brute-force attention, with every CPU backend."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(os.environ.get("ATTNKIT_SOURCE_DIR", Path(__file__).resolve().parents[2])) / "examples/python/engine_step.py"


@pytest.mark.parametrize("backend", [None, "VARLEN", "CSR_PLAN", "REFERENCE"])
def test_engine_step_example(backend):
    args = [sys.executable, str(EXAMPLE)] + ([backend] if backend else [])
    run = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "all outputs match the brute-force attention" in run.stdout
    if backend == "CSR_PLAN":
        assert "order [1, 2, 0]" in run.stdout  # decodes first: the engine followed the runner's order


def test_engine_step_example_reports_errors():
    run = subprocess.run([sys.executable, str(EXAMPLE), "NO_SUCH_BACKEND"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    assert "field: backend" in run.stderr and "value: NO_SUCH_BACKEND" in run.stderr
