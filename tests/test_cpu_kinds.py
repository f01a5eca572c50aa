"""Every CPU kind below this machine's, in one run: the tests whose paths depend on the CPU run again in a child
process held to each older kind by the environment torch's ATen kernels and oneDNN honour (hardware.CPU_KINDS).
On an AMX Xeon that is x86-64, AVX2 (an EPYC Zen 3), AVX-512 with bf16 emulated (a Xeon Cascade Lake) and AVX-512
with native bf16 (an EPYC Zen 4); the main run covers the machine's own kind with the real kernels."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dart_core.hardware import CPU_KINDS, ISA_LIMIT_VARIABLES, cpu_kind, detect, kinds_below

ROOT = Path(__file__).resolve().parent.parent
# the modules whose paths are gated on what the CPU can do: kernel choice and packing, dtype choice, int8 drafting
CPU_DEPENDENT = ["tests/test_kernels.py", "tests/test_dtype_choice.py", "tests/test_draft_kernels.py"]
HERE = detect()
# the kinds below this one that CPUs still ship with; an AVX2 machine runs as the x86-64 baseline
BELOW = [k for k in kinds_below(HERE.kind) if k != "x86-64"] or ["x86-64"]


def as_kind(kind: str) -> dict:
    """This process's environment, held to `kind` (any limit already set is replaced)."""
    env = {k: v for k, v in os.environ.items() if k not in ISA_LIMIT_VARIABLES}
    return {**env, **CPU_KINDS[kind]}


@pytest.mark.parametrize("kind", BELOW)
def test_the_cpu_dependent_tests_pass_as_an_older_cpu_kind(kind, report):
    child = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CPU_DEPENDENT],
                           cwd=ROOT, env=as_kind(kind), capture_output=True, text=True, timeout=900)
    out = child.stdout + child.stderr
    assert child.returncode == 0, out[-4000:]
    assert f"kind {kind}" in out, out[:2000]           # the child really ran as that kind (its header says so)
    summary = [line for line in out.splitlines() if " passed" in line][-1]
    assert "skipped" not in summary and "deselected" not in summary, summary
    report(f"as {kind}: {summary.strip()}; gated kernels: "
           + next(line for line in out.splitlines() if line.startswith("capability-gated kernels")).split("(")[1]
           .split(")")[0])


def test_the_kinds_are_told_apart_from_torch_and_the_flags(monkeypatch):
    monkeypatch.setattr("dart_core.hardware.cpu_flags", lambda: frozenset({"avx512_bf16", "amx_bf16"}))
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    assert cpu_kind("DEFAULT", False) == "x86-64"
    assert cpu_kind("AVX2", False) == "avx2"
    assert cpu_kind("AVX512", False) == "avx2"            # no oneDNN bf16 path: nothing above AVX2 is gated on
    assert cpu_kind("AVX512", True) == "amx"
    for limit, kind in (("AVX512_CORE_BF16", "avx512-bf16"), ("AVX512_CORE_VNNI", "avx512"),
                        ("AVX512_CORE_AMX", "amx"), ("avx512_core_bf16", "avx512-bf16")):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", limit)
        assert cpu_kind("AVX512", True) == kind, limit
    monkeypatch.setattr("dart_core.hardware.cpu_flags", lambda: frozenset({"avx512f"}))   # a Cascade Lake
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert cpu_kind("AVX512", True) == "avx512"
    assert kinds_below("avx512-bf16") == ["x86-64", "avx2", "avx512"] and kinds_below("x86-64") == []


def test_a_limited_run_says_so_and_measures_apart(monkeypatch):
    from dart_core.setup.calibration import _file_name
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    limited = detect()
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in limited.limits and "limited by ONEDNN_MAX_CPU_ISA=AVX2" in limited.describe()
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    for v in ISA_LIMIT_VARIABLES:
        monkeypatch.delenv(v, raising=False)
    free = detect()
    assert free.limits == ""
    assert _file_name("kernels", limited, []) != _file_name("kernels", free, [])   # no cache shared across kinds
