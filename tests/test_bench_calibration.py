"""The bench's clock: a cost curve re-measured in the middle of a DART run (the machine was busy, its verifies
disagreed with the curve) is machine calibration, not decoding: it is left out of the run's seconds and tokens/s and
reported apart. On a tiny model, with a re-measurement that takes a known half second."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from dart_core.budget.auto import AutoBudget
from dart_core.machine.records import CostCurve
from dart_core.proposers import DartProposer
from dart_core.setup.tiny_models import OracleDrafter, tiny_target
from dart_core.tools.bench import BenchPrompt, build_report, format_table
from dart_core.tools.bench.runner import Runner
from dart_core.tools.bench.runs_file import run_from_dict, run_to_dict
from dart_core.tree_search import SearchConfig

MEASURING = 0.5      # seconds the re-measurement takes


def _runner_with_a_wrong_curve():
    target = tiny_target("llama", seed=9)
    wrong = CostCurve((1, 64), (100.0, 100.0))       # ten thousand times too slow: the run re-measures it

    def remeasure():
        time.sleep(MEASURING)
        return wrong
    auto = AutoBudget(wrong, start=6, max_budget=20, remeasure=remeasure)
    dart = DartProposer(OracleDrafter(target, n_rows=3), SearchConfig(node_budget=6), auto_budget=auto)
    plan = SimpleNamespace(top_p=1.0, top_k=0)
    return Runner(target, {"dart": dart}, stops=[], plan=plan), auto


def test_a_curve_re_measured_mid_run_is_not_decoding_time():
    runner, auto = _runner_with_a_wrong_curve()
    prompt = BenchPrompt("p/1", "p", "x", ids=[1, 5, 9, 13, 17])
    t0 = time.perf_counter()
    run = runner.run("dart", prompt, 0.0, seed=0, max_new=96)
    wall = time.perf_counter() - t0
    assert auto.calibration_seconds >= MEASURING                      # it did re-measure, inside the call
    assert run.calibration_seconds == pytest.approx(auto.calibration_seconds)
    assert run.seconds + run.calibration_seconds <= wall
    assert run.seconds <= wall - MEASURING                            # the half second is not in the decode time
    m = run.metrics
    assert m.calibration_time == run.calibration_seconds and m.decode_time < m.wall_time - MEASURING + 1e-9
    assert m.tokens_per_s == pytest.approx(m.new_tokens / m.decode_time)

    again = runner.run("dart", prompt, 0.0, seed=0, max_new=96)       # re-measured once: the next run is clean
    assert again.calibration_seconds == 0.0 and again.metrics.calibration_time == 0.0


def test_the_report_keeps_calibration_apart_and_the_runs_file_keeps_it():
    runner, _ = _runner_with_a_wrong_curve()
    prompt = BenchPrompt("p/1", "p", "x", ids=[1, 5, 9, 13, 17])
    run = runner.run("dart", prompt, 0.0, seed=0, max_new=96)
    run.dtype = "fp32"
    report = build_report([run], ["dart"], ["fp32"], [0.0], {"p": {}})
    cell = report["results"][0]
    assert cell["seconds"] == pytest.approx(run.seconds, abs=1e-4)
    assert cell["calibration_seconds"] >= MEASURING
    assert cell["calibration_seconds"] == pytest.approx(run.calibration_seconds, abs=1e-4)
    assert cell["tokens_per_s"] == pytest.approx(len(run.output) / run.seconds, rel=1e-3)
    assert report["runs"][0]["calibration_seconds"] == pytest.approx(run.calibration_seconds, abs=1e-4)
    assert "the cost curve re-measured mid-run for" in format_table(report)

    record = run_to_dict(run)
    assert run_from_dict(record, prompt).calibration_seconds == run.calibration_seconds
    del record["calibration_seconds"]                                  # a record written before it was kept
    assert run_from_dict(record, prompt).calibration_seconds == 0.0
