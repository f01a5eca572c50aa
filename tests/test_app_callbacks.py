"""The app's event handlers without a browser: runs on the tiny target, stop, sessions, replay, what-if, bad input."""

from __future__ import annotations

import json
import os
import threading
import time

import gradio as gr
import pytest

from app.callbacks import Callbacks
from app.engine import Engine
from app.lanes import DONE, REPLAY, STOPPED, Lane, replay_lane, round_robin, why_slower
from app.options import MAX_PROMPT_CHARS
from app.pacing import Pace
from app.request import RUN_FIELDS, RunRequest
from app.session import Session
from dart_core.acceptance import SamplingConfig
from dart_core.forensics.what_if import REPLAYED, VERIFIED, what_if
from dart_core.metrics import Metrics
from dart_core.setup.loading import DraftSettings
from dart_core.trace import Trace
from dart_core.tree import TokenTree
from dart_core.tree_search import SearchConfig
from dart_core.views import figures
from dart_core.views.animation import FRAME_MS
from tests.app_fixtures import EVERY_STEP, hand_ngram, hand_trace, run_request, tiny_engine, tiny_traces


def knobs(node_budget, beam_width, topk, ngram_weight=0.5, level_exponent=0.7, logit_decay=0.9) -> dict:
    """What-if's tree knobs by name."""
    return dict(node_budget=node_budget, beam_width=beam_width, topk=topk, ngram_weight=ngram_weight,
                level_exponent=level_exponent, logit_decay=logit_decay)


@pytest.fixture(scope="module")
def engine():
    return tiny_engine()


@pytest.fixture
def cb(engine, tmp_path):
    return Callbacks(engine, tmp_path, pace=EVERY_STEP)


def run_all(cb, session, request: RunRequest):
    return list(cb.run(session, request))


def stepped_lane(update: dict) -> str:
    """Which lane a streaming update came from (a plain step also refreshes DART's card, for its speedup)."""
    if "lane_pld" in update:
        return "pld"
    return "vanilla" if "lane_vanilla" in update else "dart"


# ---------------------------------------------------------------------------------------------- generation
def test_run_streams_lanes_round_robin_and_finishes(cb):
    session = Session()
    updates = run_all(cb, session, run_request("hello", use_pld=True))
    lanes = session.lanes
    assert list(lanes) == ["vanilla", "dart", "pld"]
    assert all(lane.status == DONE for lane in lanes.values())
    # Lossless: greedy DART and prompt lookup emit exactly plain decoding's tokens.
    assert lanes["dart"].trace.output_ids == lanes["vanilla"].trace.output_ids == lanes["pld"].trace.output_ids
    assert len(lanes["vanilla"].trace.output_ids) == 12
    # After the first full view, each update comes from one lane step, taken in turn while all three run.
    assert [stepped_lane(u) for u in updates[1:7]] == ["vanilla", "dart", "pld"] * 2
    # Each lane's time is the sum of its own steps only, and the lane cards show their numbers.
    for lane in lanes.values():
        assert 0 < lane.seconds < sum(other.seconds for other in lanes.values())
    final = updates[-1]
    assert 'data-status="done · token limit"' in final["lane_dart"]
    assert "speedup" in final["lane_dart"] and "τ" in final["lane_dart"]
    assert final["downloads"] and all(p.endswith(".json.gz") for p in final["downloads"])
    saved = {Trace.load(p).method: Trace.load(p) for p in final["downloads"]}
    assert saved["dart"].output_ids == lanes["dart"].trace.output_ids
    assert saved["dart"].settings.lane_seconds == pytest.approx(lanes["dart"].seconds, abs=1e-5)
    assert all(t in saved["dart"].token_text for t in saved["dart"].mentioned_tokens())   # replayable alone


def test_a_fast_run_is_sent_in_frames_and_whenever_a_lane_ends(engine, tmp_path):
    """Steps made within one frame time go to the page as one update: here (a frame of an hour) the run's start, one
    update as each lane ends, carrying every lane that stepped since the last and the newest DART step's tree, and
    the final view."""
    session = Session()
    updates = run_all(Callbacks(engine, tmp_path, pace=Pace(frame_s=3600)), session, run_request("hello", use_pld=True))
    lanes = session.lanes
    assert all(lane.status == DONE for lane in lanes.values())
    frames = updates[1:-1]
    assert len(frames) == len(lanes) == 3
    assert {"lane_vanilla", "lane_dart", "lane_pld", "tree", "summary"} <= frames[0].keys()
    shown = [u["step"]["value"] for u in frames if "step" in u]
    assert shown == sorted(shown) and shown[-1] == len(lanes["dart"].trace.steps) - 1
    assert 'data-status="done · token limit"' in updates[-1]["lane_dart"]


def press_stop(cb, session, run, cancel: bool = False) -> tuple[dict, list]:
    """Stop pressed while `run` (suspended after an update) runs. Stop waits for the run to end, which the page's
    event loop drives on (here: this thread), or closes with `cancel` (as the page's cancel of the run event does).
    Returns Stop's view and the run's updates after it."""
    out = []
    stopper = threading.Thread(target=lambda: out.append(cb.stop(session)))
    stopper.start()
    while not session.stop.is_set():
        time.sleep(0.001)
    if cancel:
        run.close()
        rest = []
    else:
        rest = list(run)
    stopper.join(10)
    assert not stopper.is_alive()
    return out[0], rest


def test_updates_that_take_long_to_build_come_further_apart(engine, tmp_path):
    """However short the frame time, building the updates takes at most `busy_share` of the run: with a tiny share,
    after the first step's update only the lanes' ends and the final view go out."""
    session = Session()
    updates = run_all(Callbacks(engine, tmp_path, pace=Pace(frame_s=0, busy_share=1e-6)), session,
                      run_request("hello", use_pld=True))
    assert len(session.lanes["dart"].trace.steps) > 6
    assert len(updates) == 1 + 1 + len(session.lanes) + 1


def test_the_missed_token_chart_replays_the_search_only_once_the_run_is_over(engine, tmp_path, monkeypatch):
    """Its replays take seconds on a long run: while any lane still runs (DART's may have ended) the chart is drawn
    without them, and the final view draws it with them."""
    calls = []
    misses_figure = figures.misses_figure
    monkeypatch.setattr(figures, "misses_figure", lambda *a, replay=True, **k: calls.append(replay) or
                        misses_figure(*a, replay=False, **k))
    session = Session()
    cb = Callbacks(engine, tmp_path, pace=Pace(frame_s=0, tree_s=0, chart_s=0, busy_share=1))
    updates = run_all(cb, session, run_request("hello", use_pld=True, max_new_tokens=8))
    assert len(calls) == len(updates) and calls[-1] is True and not any(calls[:-1])


def test_stop_ends_within_one_step(cb):
    session = Session()
    gen = cb.run(session, run_request("stop me", max_new_tokens=40))
    for _ in range(4):       # the initial view, then three lane steps
        next(gen)
    made = {k: len(lane.trace.steps) for k, lane in session.lanes.items()}
    out, rest = press_stop(cb, session, gen)
    assert rest == []        # the run ends at once: no further step, no further update
    assert {k: len(lane.trace.steps) for k, lane in session.lanes.items()} == made
    assert all(lane.status == STOPPED for lane in session.lanes.values())
    assert "Stopped" in out["message"] and out["downloads"]
    assert out["step"]["maximum"] >= 1


def test_stop_waits_for_a_run_the_page_cancelled_and_shows_it_stopped(cb):
    """The page also cancels the run's event, which closes the run where it waits after an update: Stop then shows
    the lanes stopped at once, not after its wait."""
    session = Session()
    gen = cb.run(session, run_request("stop me", max_new_tokens=40))
    for _ in range(3):
        next(gen)
    started = time.monotonic()
    out, _ = press_stop(cb, session, gen, cancel=True)
    assert time.monotonic() - started < 5 and session.run_ended.is_set() and not session.running
    assert all(lane.status == STOPPED for lane in session.lanes.values())
    assert 'data-status="stopped' in out["lane_dart"] and "Stopped" in out["message"]


def test_round_robin_stop_flag_and_lane_errors(engine):
    sampling, settings = SamplingConfig(), DraftSettings(SearchConfig(node_budget=8))
    prompt = [1, 5, 6, 7]

    def lane(method):
        trace = engine.new_trace(method, prompt, "", sampling, 30, settings)
        return Lane(method, trace, engine.steps(method, prompt, sampling, 30, settings))

    stop = threading.Event()
    lanes = [lane("vanilla"), lane("dart")]
    seen = []
    for ln, step in round_robin(lanes, stop):
        seen.append(ln.key)
        if len(seen) == 5:
            stop.set()
    assert seen == ["vanilla", "dart", "vanilla", "dart", "vanilla"]
    assert [len(ln.trace.steps) for ln in lanes] == [3, 2]

    def broken():
        yield from ()
        raise RuntimeError("boom")

    bad = Lane("pld", Trace("pld", prompt), broken())
    good = lane("vanilla")
    list(round_robin([bad, good]))
    assert bad.status == "error" and "boom" in bad.error and good.status == DONE


def test_two_sessions_never_share_text_or_traces(cb):
    a, b = Session(), Session()
    gen_a = cb.run(a, run_request("first prompt"))
    gen_b = cb.run(b, run_request("zz other", max_new_tokens=6))
    outs_a, outs_b = [], []
    for out_a, out_b in zip(gen_a, gen_b):   # interleaved, as two browsers would be
        outs_a.append(out_a)
        outs_b.append(out_b)
    outs_a += list(gen_a)
    outs_b += list(gen_b)
    assert a.lanes["dart"].trace is not b.lanes["dart"].trace
    assert a.lanes["dart"].trace.prompt_text == "first prompt" and b.lanes["dart"].trace.prompt_text == "zz other"
    assert len(a.lanes["vanilla"].trace.output_ids) == 12 and len(b.lanes["vanilla"].trace.output_ids) == 6
    # Same answers as a session running alone.
    solo = Session()
    run_all(cb, solo, run_request("first prompt"))
    assert solo.lanes["dart"].trace.output_ids == a.lanes["dart"].trace.output_ids
    assert all(u.get("state", a) is a for u in outs_a) and all(u.get("state", b) is b for u in outs_b)
    assert set(outs_a[-1]["downloads"]).isdisjoint(outs_b[-1]["downloads"])


@pytest.mark.parametrize("prompt, over, expect", [
    ("", {}, "The prompt is empty"),
    ("   \n", {}, "The prompt is empty"),
    ("x" * (MAX_PROMPT_CHARS + 1), {}, "too long"),
    ("ok", {"node_budget": 1000}, "Node budget must be between 0 and 256"),
    ("ok", {"temperature": -1}, "Temperature must be between"),
    ("ok", {"top_p": 0}, "Top-p must be between"),
    ("ok", {"max_new_tokens": 2.5}, "Max new tokens must be a whole number"),
    ("ok", {"beam_width": "abc"}, "Beam width must be a number"),
    ("ok", {"seed": None}, "Seed is empty"),
])
def test_bad_input_gives_a_message_not_a_run(cb, prompt, over, expect):
    session = Session()
    with pytest.warns(UserWarning, match=expect):
        updates = run_all(cb, session, run_request(prompt, **over))
    assert len(updates) == 1 and expect in updates[0]["message"]
    assert 'class="msg-box msg-error"' in updates[0]["message"]
    assert session.lanes == {}


def test_prompt_too_many_tokens(engine, tmp_path, monkeypatch):
    monkeypatch.setattr("app.engine.MAX_PROMPT_TOKENS", 5)
    with pytest.warns(UserWarning, match="too long: 9 tokens, at most 5"):
        updates = run_all(Callbacks(engine, tmp_path), Session(), run_request("12345678"))
    assert "too long" in updates[0]["message"]


def test_replay_mode_cannot_generate(tmp_path):
    cb = Callbacks(Engine.replay_only(None), tmp_path)
    with pytest.warns(UserWarning, match="Replay mode"):
        updates = run_all(cb, None, run_request("hello"))
    assert "Replay mode" in updates[0]["message"]


# ---------------------------------------------------------------------------------------------- step selection
def test_step_selection_click_and_bounds(cb):
    session = Session()
    run_all(cb, session, run_request("steps"))
    n = len(session.lanes["dart"].trace.steps)
    view = cb.token_click(session, {"lane": "dart", "step": 2})
    assert view["step"]["value"] == 2 and view["lane"]["value"] == "dart" and session.follow is False
    assert "step 2</b>" in view["step_info"]
    assert view["tree"].layout.title.text.startswith("Step 2:")
    assert cb.token_click(session, {"lane": "nope", "step": 1}) == {}
    assert cb.token_click(session, "garbage") == {}
    assert cb.move_step(session, "dart", n - 1, +1)["step"]["value"] == n - 1     # clamped at the end
    assert cb.move_step(session, "dart", 0, -1)["step"]["value"] == 0
    assert cb.pick_step(session, "vanilla", 3)["tree"].layout.title.text.startswith("Step 3:")
    assert cb.show_step(session, "dart", "junk")["step"]["value"] == n - 1
    pruned = cb.show_step(session, "dart", 1, True)["tree"]
    assert any(t.name.startswith("pruned") for t in pruned.data)


def test_follow_newest_step_while_generating(cb):
    session = Session()
    gen = cb.run(session, run_request("follow", max_new_tokens=20))
    next(gen)
    dart_updates = [u for u in (next(gen) for _ in range(6)) if "tree" in u]
    assert [u["step"]["value"] for u in dart_updates] == [0, 1, 2]
    cb.pick_step(session, "dart", 0)          # the user picks a step: following stops
    later = [next(gen) for _ in range(4)]
    assert not any("tree" in u for u in later)
    assert any("step" in u and "value" not in u["step"] for u in later)   # only the slider's range grows
    out, _ = press_stop(cb, session, gen)
    assert "tree" not in out and "value" not in out["step"]                 # the picked step stays in view


# ---------------------------------------------------------------------------------------------- replay
def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_upload_replays_saved_traces(tmp_path):
    cb = Callbacks(Engine.replay_only(None), tmp_path / "out")
    traces = tiny_traces()
    paths = [write(tmp_path, f"{k}.json", t.to_dict()) for k, t in traces.items()]
    session = Session()
    out = cb.upload(session, paths)
    assert list(session.lanes) == ["vanilla", "dart", "pld"]
    assert all(lane.status == REPLAY for lane in session.lanes.values())
    assert "Loaded" in out["message"] and "msg-info" in out["message"]
    assert out["lane_dart"].count('class="tok tok-') == len(traces["dart"].output_ids)
    assert out["step"]["maximum"] == len(traces["dart"].steps) - 1
    assert out["tree"].layout.title.text.startswith(f"Step {len(traces['dart'].steps) - 1}:")
    assert out["lane"]["value"] == "dart"
    assert out["wi_node_budget"] == traces["dart"].settings.search.node_budget


@pytest.mark.parametrize("content, expect", [
    ("not json {", "is not JSON"),
    ({"format": "something-else"}, "not a DART Lab trace"),
    ({"format": "dart-lab-trace/1", "method": "dart"}, "trace is damaged"),
    ({**hand_trace().to_dict(), "method": "magic"}, "unknown method"),
    ({**hand_trace().to_dict(), "steps": []}, "has no steps"),
])
def test_invalid_trace_files_give_a_message(tmp_path, content, expect):
    cb = Callbacks(Engine.replay_only(None), tmp_path / "out")
    session = Session()
    with pytest.warns(UserWarning, match="Could not load the trace"):
        out = cb.upload(session, [write(tmp_path, "bad.json", content)])
    assert expect in out["message"] and session.lanes == {}


def test_trace_with_a_broken_step_is_rejected(tmp_path):
    data = hand_trace().to_dict()
    data["steps"][1]["path"] = [0, 99]
    cb = Callbacks(Engine.replay_only(None), tmp_path / "out")
    with pytest.warns(UserWarning):
        out = cb.upload(Session(), [write(tmp_path, "broken.json", data)])
    assert "not inside its tree" in out["message"]


def test_file_name_in_message_is_escaped(tmp_path):
    cb = Callbacks(Engine.replay_only(None), tmp_path / "out")
    with pytest.warns(UserWarning):
        out = cb.upload(Session(), [write(tmp_path, "<img src=x>.json", "nope")])
    assert "<img" not in out["message"] and "&lt;img" in out["message"]


# ---------------------------------------------------------------------------------------------- what-if
def test_follow_tokens():
    tree = TokenTree([1, 5, 6, 7, 8], [-1, 0, 0, 1, 3])
    assert tree.follow([5, 7, 8, 9]) == ([0, 1, 3, 4], 9)
    assert tree.follow([6, 3]) == ([0, 2], 3)
    assert tree.follow([5]) == ([0, 1], None)


def test_what_if_same_knobs_reproduces_the_recorded_step():
    trace = hand_trace()
    step = trace.steps[1]
    cfg = trace.settings.search
    result = what_if(trace, 1, cfg, hand_ngram(), frozenset({2}))
    assert result.how == REPLAYED
    assert result.tree.tokens == step.tree.tokens and result.tree.parents == step.tree.parents
    assert result.path == step.path and result.bonus == step.new_tokens[-1]
    smaller = what_if(trace, 1, SearchConfig(topk=3, beam_width=2, node_budget=1), hand_ngram(), frozenset({2}))
    assert len(smaller.tree) == 2 and smaller.accepted == 1 and smaller.bonus == 23


def test_what_if_callback_without_model(tmp_path):
    cb = Callbacks(Engine(replay_ngram=hand_ngram()), tmp_path)
    session = Session()
    session.new_run([replay_lane(hand_trace())])
    out = cb.what_if(session, "dart", 1, knobs(1, 2, 3))
    assert out["wi_tree"].layout.title.text.startswith("What-if on step 1: 1 draft nodes, 1 accepted")
    assert "Recorded</b>: 5 nodes, 2 accepted" in out["wi_info"] and "greedy" in out["wi_info"]
    with pytest.warns(UserWarning, match="no draft rows"):
        assert "no draft rows" in cb.what_if(session, "dart", 0, knobs(5, 2, 3))["message"]
    with pytest.warns(UserWarning, match="Node budget must be"):
        cb.what_if(session, "dart", 1, knobs(-3, 2, 3))
    with pytest.warns(UserWarning, match="Run a prompt"):
        cb.what_if(Session(), "dart", 1, knobs(5, 2, 3))


def test_animate_and_autoplay_callbacks(tmp_path):
    cb = Callbacks(Engine(), tmp_path)
    session = Session()
    for out in (cb.animate_step(session, "dart", 1, 1.0), cb.autoplay_run(None, "dart", 2.0)):   # no run yet
        assert not out["animation"].frames and "no run to animate" in out["animation"].layout.annotations[0].text
    session.new_run([replay_lane(hand_trace())])
    fig = cb.animate_step(session, "dart", 1, 2.0)["animation"]
    assert [f.name for f in fig.frames][0] == "rows" and fig.frames[-1].name == "accepted"
    assert fig.layout.updatemenus[0].buttons[0].args[1]["frame"]["duration"] == FRAME_MS // 2
    assert cb.animate_step(session, "dart", 99, "fast")["animation"].frames[-1].name == "accepted"  # clamped, 1x
    assert len(cb.animate_step(session, "dart", 0, 1.0)["animation"].frames) == 1                   # the prefill
    assert len(cb.autoplay_run(session, "dart", 0.5)["animation"].frames) == 2


def test_the_animation_buttons_send_the_figure_with_its_frames(tmp_path):
    from app.ui import build_app
    fns = {f.api_name: f for f in build_app(Engine.replay_only(None), trace_dir=tmp_path).fns.values()}
    session = Session()
    session.new_run([replay_lane(hand_trace())])
    for name, args in (("animate_step", ("dart", 1, 1.0)), ("autoplay_run", ("dart", 1.0))):
        out = fns[name].fn(session, *args)
        value = next(v for k, v in out.items() if getattr(k, "elem_id", None) == "animation-plot")
        assert json.loads(value)["frames"]   # gr.Plot would drop them: the page draws this JSON itself


def test_the_run_api_takes_the_request_fields_in_their_order(engine, tmp_path):
    """The page's Run inputs (and so the /page_run endpoint that scripts/soak.py calls) follow RunRequest's fields,
    and the page's values reach the run as the named fields."""
    from app.ui import build_app
    run = next(f for f in build_app(engine, trace_dir=tmp_path).fns.values() if f.api_name == "page_run")
    assert [c.elem_id for c in run.inputs[1:]] == [name.replace("_", "-") for name in RUN_FIELDS]
    request = run_request("named", max_new_tokens=3, use_pld=True)
    updates = list(run.fn(Session(), *request.values()))
    session = next(v for k, v in updates[0].items() if isinstance(k, gr.State))
    assert list(session.lanes) == ["vanilla", "dart", "pld"]            # use_pld reached the run
    assert all(lane.trace.settings.max_new_tokens == 3 for lane in session.lanes.values())


def test_what_if_verified_by_the_model_matches_the_greedy_replay(cb):
    session = Session()
    run_all(cb, session, run_request("what if", max_new_tokens=16))
    trace = session.lanes["dart"].trace
    engine = cb.engine
    for index in range(1, len(trace.steps)):
        for budget in (3, 30):
            cfg = SearchConfig(node_budget=budget, beam_width=4, topk=6)
            verifier = engine.verifier(SamplingConfig())
            verified = what_if(trace, index, cfg, engine.ngram, engine.loaded.stop_ids, verifier)
            replayed = what_if(trace, index, cfg, engine.ngram, engine.loaded.stop_ids)
            assert verified.how == VERIFIED and replayed.how == REPLAYED
            assert verified.path == replayed.path
            if replayed.bonus is not None:
                assert verified.bonus == replayed.bonus
    out = cb.what_if(session, "dart", 1, knobs(3, 4, 6))
    assert "verified with one target forward" in out["wi_info"]
    with pytest.warns(UserWarning, match="needs a DART step"):
        cb.what_if(session, "vanilla", 1, knobs(3, 4, 6))


def test_clear_resets_the_session(cb):
    session = Session()
    run_all(cb, session, run_request("clear me", max_new_tokens=4))
    out = cb.clear(session)
    assert session.lanes == {} and out["prompt"] == "" and out["downloads"] is None
    assert "Run a prompt to fill this lane" in out["lane_dart"]


def test_only_the_latest_traces_stay_on_disk(cb):
    session = Session()
    first = run_all(cb, session, run_request("one", max_new_tokens=3))[-1]["downloads"]
    second = run_all(cb, session, run_request("two", max_new_tokens=3))[-1]["downloads"]
    assert all(not os.path.exists(p) for p in first)
    assert all(Trace.load(p).prompt_text == "two" for p in second)


def test_stop_when_nothing_runs_says_nothing(cb):
    session = Session()
    run_all(cb, session, run_request("done", max_new_tokens=3))
    out = cb.stop(session)
    assert out["message"] == "" and all(lane.status == DONE for lane in session.lanes.values())


def test_app_wiring_queue_cancels_and_no_tracebacks(tmp_path):
    from app.ui import build_app
    demo = build_app(Engine.replay_only(None), trace_dir=tmp_path)
    fns = {f.api_name: f for f in demo.fns.values()}
    run, stop, clear, what = fns["page_run"], fns["stop"], fns["clear"], fns["what_if"]
    # Everything that drives the model shares one queue slot across all sessions.
    for f in (run, what):
        assert f.concurrency_limit == 1 and f.concurrency_id == "model"
    submit = next(f for f in demo.fns.values() if [t[1] for t in f.targets] == ["submit"])
    assert submit.concurrency_id == "model"
    ids = {id(f): i for i, f in demo.fns.items()}
    for f in (stop, clear):   # Stop and Clear each also fire a cancel of the run (button and Enter in the prompt)
        cancel = next(c for c in demo.fns.values() if c.is_cancel_function and c.targets == f.targets)
        assert {ids[id(run)], ids[id(submit)]} <= set(cancel.cancels)
    # An unexpected error inside a handler becomes a message box, not a traceback.
    with pytest.warns(UserWarning, match="Something went wrong"):
        out = what.fn("not a session", "dart", 1, 5, 2, 3, 0.5, 0.7, 0.9)
    message = next(v for k, v in out.items() if getattr(k, "elem_id", None) == "message")
    assert "Something went wrong: AttributeError" in message and "Traceback" not in message


def test_lookup_branch_option_grafts_prompt_lookup_onto_darts_trees(cb):
    session = Session()
    # a repetitive prompt, so the lookup finds earlier n-grams to copy
    run_all(cb, session, run_request("ab ab ab ab ab ab", max_new_tokens=16, lookup_branch=True))
    dart, plain = session.lanes["dart"].trace, session.lanes["vanilla"].trace
    assert dart.output_ids == plain.output_ids                         # still lossless
    assert dart.method == "dart_pld" and dart.settings.lookup_tokens == 5
    step = next((s for s in dart.steps[1:] if s.lookup_nodes), None)
    assert step is not None, "no step got a prompt-lookup branch"
    branch = [step.tree.tokens[n] for n in step.tree.path_to(max(step.lookup_nodes))[1:]]
    # what-if reruns only the search: the recorded branch is still a whole path of the new tree
    again = what_if(dart, step.index, SearchConfig(node_budget=1, beam_width=4, topk=6), cb.engine.ngram,
                    cb.engine.loaded.stop_ids, cb.engine.verifier(SamplingConfig()))
    path, _ = again.tree.follow(branch + [-1])
    assert len(path) - 1 == len(branch) and again.lookup_nodes
    assert len(again.tree) - 1 <= 1 + len(branch)


def test_an_automatic_budget_runs_and_draws_the_cost_on_this_machine(engine, tmp_path, monkeypatch):
    monkeypatch.setenv("DART_CACHE_DIR", str(tmp_path / "cache"))     # the tiny model's curve: measured here
    cb = Callbacks(engine, tmp_path / "out")
    session = Session()
    run_all(cb, session, run_request("hello there", max_new_tokens=40, auto_budget=True))
    dart, plain = session.lanes["dart"].trace, session.lanes["vanilla"].trace
    assert dart.output_ids == plain.output_ids                                     # still lossless
    assert dart.settings.auto_budget and dart.settings.machine.cost_curve.rows[0] == 1
    assert all(s.budget.auto for s in dart.steps[1:])
    chosen = [s.budget.choice.budget for s in dart.steps[1:] if s.budget.choice is not None]
    assert chosen, "no budget was chosen in 40 tokens"
    fig = cb.charts(session, "dart")["chart_cost"]
    names = [t.name for t in fig.data]
    assert names[0].startswith("verify cost t(1+n) / t(1), fitted")
    # the points of the fit, the curve as the run's own verifies measured it (what the choice weighed), the speedup
    assert names[1:4] == ["measured (median)", "as this run's verifies measured it",
                          "expected speedup over plain decoding"]
    last = [s.budget.choice for s in dart.steps[1:] if s.budget.choice is not None][-1]
    assert list(fig.data[2].y)[0] == pytest.approx(1.0) and last.curve is not None
    assert list(fig.data[4].x) == [chosen[-1]]                                    # the chosen budget, marked
    assert "threads" in fig.layout.title.text                                      # which machine it was
    # the step line says how each budget was set
    drafted = [s.index for s in dart.steps[1:] if s.budget.nodes and s.budget.choice is not None]
    plain = [s.index for s in dart.steps[1:] if s.budget.nodes == 0]
    assert drafted, "no drafted step after a choice"
    assert "tokens per step expected" in cb.step_view(session, "dart", drafted[-1])["step_info"]
    for i in plain[:1]:   # the random head does not pay on most machines: plain decoding, said plainly
        assert "plain decoding: no tree pays" in cb.step_view(session, "dart", i)["step_info"]


def test_the_tree_knobs_are_search_configs_own(tmp_path):
    """One list of knobs: SearchConfig's field metadata makes the command line's options, the page's tree sliders and
    what-if's inputs (labels, ranges, defaults), and each reads back into the SearchConfig it names."""
    from app.ui import build_app
    from dart_core.tools.args import Parser, add_search_args, search_config_from
    from dart_core.tree_search import search_knobs

    registry = search_knobs()
    names = [k.name for k in registry]
    assert names == ["node_budget", "beam_width", "topk", "ngram_weight", "level_exponent", "logit_decay"]
    demo = build_app(Engine.replay_only(None), trace_dir=tmp_path)
    sliders = {b.elem_id: b for b in demo.blocks.values() if isinstance(b, gr.Slider)}
    for knob in registry:
        for elem_id in (knob.name.replace("_", "-"), "wi-" + knob.name.replace("_", "-")):   # Run's and what-if's
            slider = sliders[elem_id]
            assert (slider.label, slider.minimum, slider.maximum, slider.step) == \
                (knob.label, knob.minimum, knob.maximum, knob.step)
            assert slider.info == knob.help
    what = next(f for f in demo.fns.values() if f.api_name == "what_if")
    assert [c.elem_id for c in what.inputs[3:]] == ["wi-" + n.replace("_", "-") for n in names]

    parser = Parser()
    add_search_args(parser)
    flags = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
    assert all(knob.flag in flags and flags[knob.flag].help.startswith(knob.help) for knob in registry)
    values = {"node_budget": 7, "beam_width": 3, "topk": 5, "ngram_weight": 0.25, "level_exponent": 1.5,
              "logit_decay": 0.5}
    argv = [str(x) for knob in registry for x in (knob.flag, values[knob.name])]
    assert search_config_from(parser.parse_args(argv)) == SearchConfig(**values)
    assert search_config_from(parser.parse_args([])) == SearchConfig(node_budget=8)   # 'auto' starts at 8 on CPU


def test_a_run_never_measures_the_cost_curve_again(engine, tmp_path, monkeypatch):
    """A visitor's run whose verify times disagree with the cached curve scales it for itself, and leaves the cached
    curve as it was: on a machine busy with other visitors, a curve measured mid-run would replace a good one."""
    monkeypatch.setenv("DART_CACHE_DIR", str(tmp_path / "cache"))
    cb = Callbacks(engine, tmp_path / "out")
    run_all(cb, Session(), run_request("measure here", max_new_tokens=4, auto_budget=True))   # measured and cached
    [cached] = (tmp_path / "cache" / "calibration").glob("cost-*.json")
    curve = json.loads(cached.read_text())
    wrong = {**curve, "seconds": [s * 50 for s in curve["seconds"]]}                      # 50 times too slow
    cached.write_text(json.dumps(wrong))
    session = Session()
    run_all(cb, session, run_request("hello there", max_new_tokens=40, auto_budget=True))
    fixes = [s.budget.curve for s in session.lanes["dart"].trace.steps[1:] if s.budget and s.budget.curve]
    assert fixes and fixes[0].ratio < 0.2 and all(fix.action == "scaled" for fix in fixes)   # never re-measured
    assert json.loads(cached.read_text()) == wrong                                         # the cached curve stays
    assert session.lanes["dart"].trace.output_ids == session.lanes["vanilla"].trace.output_ids


def test_where_dart_ran_slower_the_summary_says_why_from_the_runs_own_times():
    plain = Metrics(new_tokens=100, verify_steps=100, wall_time=0.35)
    plain.phase_time.update(verify=0.30, accept=0.002)
    dart = Metrics(new_tokens=100, verify_steps=70, verify_tokens=100, wall_time=0.40)
    dart.phase_time.update(draft=0.05, search=0.02, verify=0.28, accept=0.002)
    said = why_slower(plain, dart)
    # 5.03 ms a DART step (1.0 drafting and searching, 4.0 verifying) against 3.02 a plain one (1.67x), 1.43 tokens
    assert "1.67x a plain one (5.0 ms: 1.0 drafting and searching, 4.0 verifying its tree; plain 3.0)" in said
    assert "for 1.43 tokens" in said
    assert why_slower(plain, Metrics(new_tokens=100, verify_steps=40, verify_tokens=100, wall_time=0.2)) == ""
    assert why_slower(Metrics(), dart) == ""   # nothing to compare against
