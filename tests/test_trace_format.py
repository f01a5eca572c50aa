"""The trace file: format 2's packed columns, gzip, trimmed candidates, typed settings, and format 1 files."""

from __future__ import annotations

import copy
import gzip
import json

import numpy as np
import pytest

from app.callbacks import Callbacks
from app.engine import Engine
from app.session import Session
from dart_core.acceptance import SamplingConfig
from dart_core.trace import READABLE_FORMATS, TRACE_FORMAT, RunSettings, Trace, TraceError, best_candidates, unpack
from dart_core.tree_search import KEPT, SearchConfig
from tests.app_fixtures import tiny_traces


@pytest.fixture(scope="module")
def dart():
    return tiny_traces(max_new_tokens=24)["dart"]


def steps_with_candidates(trace):
    return [s for s in trace.steps if s.candidates is not None and len(s.candidates)]


def assert_same_steps(a: Trace, b: Trace, score_atol: float = 1e-4) -> None:
    assert a.output_ids == b.output_ids and len(a.steps) == len(b.steps)
    for x, y in zip(a.steps, b.steps):
        assert (x.tree, x.path, x.new_tokens, x.accepted, x.lookup_nodes) == (y.tree, y.path, y.new_tokens,
                                                                              y.accepted, y.lookup_nodes)
        if x.rows_tokens is not None:
            assert np.array_equal(x.rows_tokens, y.rows_tokens)
            assert np.allclose(x.rows_probs, y.rows_probs, atol=1e-7)
        if x.candidates is not None:
            cx, cy = x.candidates, y.candidates
            for col in ("token", "level", "parent", "ngram_match", "node"):
                assert np.array_equal(getattr(cx, col), getattr(cy, col)), col
            assert list(cx.fate) == list(cy.fate) and list(cx.beam) == list(cy.beam)
            for col in ("draft_prob", "logit_term", "ngram_term", "level_weight", "score"):
                assert np.allclose(getattr(cx, col), getattr(cy, col), atol=score_atol, equal_nan=True), col


def test_round_trip_plain_and_gzip(dart, tmp_path):
    assert steps_with_candidates(dart), "the fixture must have tree-search candidates"
    plain_size = dart.save(tmp_path / "t.json")
    gz_size = dart.save(tmp_path / "t.json.gz")
    assert (tmp_path / "t.json.gz").read_bytes()[:2] == b"\x1f\x8b" and gz_size < plain_size / 2
    for name in ("t.json", "t.json.gz"):
        back = Trace.load(tmp_path / name)
        assert back.method == dart.method and back.settings == dart.settings and back.token_text == dart.token_text
        assert_same_steps(dart, back)


def test_derived_columns_are_recomputed_not_stored(dart):
    data = dart.to_dict()
    packed = next(s["candidates"] for s in data["steps"] if s["candidates"])
    assert "score" not in packed and "ngram_term" not in packed
    assert packed["derived"]["ngram_weight"] == dart.settings.search.ngram_weight
    # without the search knobs nothing can be derived: every column is stored
    bare = copy.copy(dart)
    bare.settings = RunSettings()
    full = next(s["candidates"] for s in bare.to_dict()["steps"] if s["candidates"])
    assert "score" in full and "derived" not in full
    assert_same_steps(dart, Trace.from_dict(bare.to_dict()))


def test_numbers_are_packed_arrays(dart):
    step = next(s for s in dart.to_dict()["steps"] if s["rows_tokens"])
    rows = unpack(step["rows_tokens"])
    assert step["rows_tokens"]["dtype"] == "<i4" and rows.shape == dart.steps[step["index"]].rows_tokens.shape


def test_top_candidates_keeps_the_best_the_tree_and_their_parents(dart, tmp_path):
    step = max(steps_with_candidates(dart), key=lambda s: len(s.candidates))
    c = step.candidates
    small = best_candidates(c, 3)
    kept = int((c.fate == KEPT).sum())
    assert kept <= len(small) < len(c)
    assert int((small.fate == KEPT).sum()) == kept
    assert set(np.sort(c.score)[::-1][:3]) <= set(small.score)
    for i in range(len(small)):   # every candidate keeps its whole parent path, renumbered
        p = int(small.parent[i])
        assert p < i and (p < 0 or small.level[p] == small.level[i] - 1)
    dart.save(tmp_path / "top.json", top_candidates=3)
    back = Trace.load(tmp_path / "top.json")
    assert back.settings.top_candidates == 3 and dart.settings.top_candidates is None
    assert all(len(b.candidates) < len(a.candidates) for a, b in zip(dart.steps, back.steps)
               if a.candidates is not None and len(a.candidates) > kept + 3)
    assert [s.tree for s in back.steps] == [s.tree for s in dart.steps]     # replay is unchanged


def format1(trace: Trace) -> dict:
    """What the format-1 writer produced: numbers as JSON lists, settings as a free dict."""
    d = trace.to_dict()
    d["format"] = "dart-lab-trace/1"
    for s, step in zip(d["steps"], trace.steps):
        if step.rows_tokens is not None:
            s["rows_tokens"], s["rows_probs"] = step.rows_tokens.tolist(), step.rows_probs.tolist()
        if step.candidates is not None:
            s["candidates"] = step.candidates.to_dict()
    d["settings"] = {"model": "tiny", "dtype": "fp32", "sampling": trace.settings.sampling.to_dict(),
                     "search": trace.settings.search.to_dict(), "stop_ids": [2], "lane_time_s": 1.5, "note": "x"}
    return d


def test_format_1_files_still_load(dart, tmp_path):
    old = format1(dart)
    (tmp_path / "old.json").write_text(json.dumps(old))
    back = Trace.load(tmp_path / "old.json")
    assert back.settings.search == dart.settings.search and back.settings.stop_ids == [2]
    assert back.settings.lane_seconds == 1.5
    assert_same_steps(dart, back, score_atol=1e-5)
    # format 1's app wrote DART with the lookup branch as method "dart" plus a setting
    old["settings"]["lookup_branch"] = True
    assert Trace.from_dict(old).method == "dart_pld"
    # the lane's time as format 2 first named it
    del old["settings"]["lane_time_s"]
    old["settings"]["own_time_s"] = 2.5
    assert Trace.from_dict(old).settings.lane_seconds == 2.5


@pytest.mark.parametrize("data, message", [
    ({"format": "dart-lab-trace/9"}, "'dart-lab-trace/9' is not supported"),
    ({"format": "something else"}, "not a DART Lab trace"),
    ({"format": TRACE_FORMAT, "method": "medusa", "prompt_ids": [1], "steps": []}, "unknown method 'medusa'"),
    ({"format": TRACE_FORMAT, "method": "dart", "steps": []}, "trace is damaged"),
])
def test_unreadable_traces_are_refused_with_a_reason(data, message, tmp_path):
    (tmp_path / "t.json").write_text(json.dumps(data))
    with pytest.raises(TraceError, match=message):
        Trace.load(tmp_path / "t.json")
    assert all(f in str(READABLE_FORMATS) for f in ("dart-lab-trace/1", "dart-lab-trace/2"))


def test_damaged_gzip_and_missing_files(tmp_path):
    (tmp_path / "cut.json.gz").write_bytes(gzip.compress(b'{"format": "dart-lab-trace/2"')[:-6])
    with pytest.raises(TraceError, match="cannot be read"):
        Trace.load(tmp_path / "cut.json.gz")
    with pytest.raises(TraceError, match="not found"):
        Trace.load(tmp_path / "nothing.json")
    with pytest.raises(TraceError, match="folder"):
        Trace.load(tmp_path)


def test_run_settings_round_trip_and_leniency():
    s = RunSettings(model="m", draft="default", ngram="none", dtype="bf16", sampling=SamplingConfig(0.7, 0.9, 5, 3),
                    search=SearchConfig(node_budget=8), max_new_tokens=64, stop_ids=[2, 7], lookup_tokens=5)
    assert RunSettings.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert RunSettings.from_dict({"unknown": 1, "model": "x"}) == RunSettings(model="x")


def test_the_app_says_what_a_trimmed_trace_cannot_show(dart, tmp_path):
    cb = Callbacks(Engine.replay_only(None), tmp_path / "out")
    dart.save(tmp_path / "full.json.gz")
    dart.save(tmp_path / "top.json.gz", top_candidates=2)
    step = next(s.index for s in dart.steps if s.candidates is not None and len(s.candidates))
    infos = {}
    for name in ("full", "top"):
        session = Session()
        cb.upload(session, [str(tmp_path / f"{name}.json.gz")])
        infos[name] = cb.step_view(session, "dart", step)["step_info"]
    assert "only the best 2 candidates" in infos["top"] and "only the best" not in infos["full"]
