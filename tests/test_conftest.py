"""The test run's first and last lines name the CPU and its kind (tests/conftest.py), quiet or not: results read
later say which machine they are from."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("quiet", [[], ["-q"]])
def test_the_first_and_last_lines_name_the_cpu_and_its_kind(quiet):
    # one small test of another module, in a child pytest as a user runs it
    result = subprocess.run([sys.executable, "-m", "pytest", *quiet, "-p", "no:cacheprovider",
                             "tests/test_jsonl.py::test_gzipped_files_read_and_write_alike"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    cpu = next(line for line in lines if line.startswith("CPU: "))
    assert " · kind " in cpu
    first = lines[0] if quiet else lines[2]        # without -q: under pytest's own two header lines
    assert first == cpu and lines[-1] == cpu
