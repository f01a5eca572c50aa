"""The app's event handlers, without the layout: each takes the session and plain input values and returns (or
yields) a dict of output name -> value, which `app.ui` maps onto components. Tested without a browser.

Rules kept here: bad input shows a warning and a message box, never a traceback; the only shared objects are the
engine and the session store given to `Callbacks`; everything per user is in the `Session` passed in, which every
event marks as used (`session_event`), so that the store frees only sessions nobody uses.
"""

from __future__ import annotations

import functools
import html
import inspect
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import gradio as gr

from dart_core.errors import DartError
from dart_core.forensics.what_if import HOW_TEXT, is_greedy, what_if
from dart_core.methods import DART, LANE_ORDER, LANES, PLD, VANILLA, lane_of
from dart_core.setup.loading import DraftSettings
from dart_core.trace import Trace, TraceError, check_trace
from dart_core.views import figures
from dart_core.views.animation import SPEEDS, run_animation, step_animation
from dart_core.views.pruning import fate_counts, pruning_table
from dart_core.views.report import report_html
from dart_core.views.story import story_html
from dart_core.views.text_render import lane_html, lane_text_html, token_text

from . import step_pick
from .engine import Engine, EngineError
from .lanes import DONE, ERROR, STOPPED, Lane, lane_stats, lane_status_text, replay_lane, round_robin, why_slower
from .options import TREE_KNOB_NAMES, OptionError, check_knob, check_prompt, sampling_from, search_from
from .pacing import Pace, Pacer
from .request import RunRequest
from .session import Session, SessionStore, freed_text

log = logging.getLogger(__name__)

LANE_OUTPUTS = {key: f"lane_{key}" for key in LANE_ORDER}
STEP_OUTPUTS = ("step", "step_info", "tree", "table", "heatmap")
CHART_OUTPUTS = ("chart_accept", "chart_position", "chart_time", "chart_cost", "chart_missed")
WHATIF_OUTPUTS = tuple(f"wi_{name}" for name in TREE_KNOB_NAMES)   # what-if's inputs: the tree knobs
END_WAIT_S = 30   # Stop and Clear wait at most this long for a run's step in flight
MAX_TRACE_BYTES = 64 << 20
NOTHING_TO_ANIMATE = "Run a prompt or upload a trace first: there is no run to animate yet."


def message_html(text: str = "", kind: str = "error") -> str:
    if not text:
        return ""
    return f'<div class="msg-box msg-{kind}" role="alert">{html.escape(text)}</div>'


def warn(text: str) -> dict:
    """Show a warning toast and the message box (the text is escaped: gr.Warning renders HTML)."""
    gr.Warning(html.escape(text))
    return {"message": message_html(text)}


def session_event(tell: bool = True):
    """An event on the page's session (its first argument): the store marks it as used now, and gives a page whose
    state Gradio dropped a new one. A session the store had freed is held again, empty; with `tell`, the page is told
    why its run is gone (not for a run or an upload, which replace it anyway)."""
    def wrap(fn):
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def gen(self, session, *args, **kwargs):
                session, _ = self.sessions.resume(session)
                yield from fn(self, session, *args, **kwargs)
            return gen

        @functools.wraps(fn)
        def call(self, session, *args, **kwargs):
            session, why = self.sessions.resume(session)
            out = fn(self, session, *args, **kwargs)
            if why and tell:
                out = {**(out or {}), **warn(freed_text(why, self.sessions.ttl_s))}
            return out
        return call
    return wrap


class Callbacks:
    def __init__(self, engine: Engine, trace_dir: str | Path | None = None, sessions: SessionStore | None = None,
                 pace: Pace = Pace()):
        self.engine = engine
        self.pace = pace
        self.trace_dir = Path(trace_dir) if trace_dir else Path(tempfile.gettempdir()) / "dart-lab-traces"
        self.sessions = sessions or SessionStore()

    # ------------------------------------------------------------------ views
    def lane_card(self, session: Session, key: str) -> str:
        lane = session.lanes.get(key)
        title = LANES[key].title
        if lane is None:
            return lane_html(key, title, "idle", [], '<pre class="lane-text lane-empty">Run a prompt to fill this '
                                                      'lane.</pre>')
        body = lane_text_html(lane.trace, key, frozenset(lane.trace.settings.stop_ids))
        return lane_html(key, title, lane_status_text(lane), lane_stats(lane, session.lanes.get(VANILLA)), body)

    def lane_cards(self, session: Session) -> dict:
        out = {LANE_OUTPUTS[k]: self.lane_card(session, k) for k in LANE_ORDER}
        out[LANE_OUTPUTS[PLD]] = gr.update(value=out[LANE_OUTPUTS[PLD]], visible=PLD in session.lanes)
        return out

    def summary(self, session: Session) -> str:
        plain, dart = session.lanes.get(VANILLA), session.lanes.get(DART)
        if not plain or not dart or not plain.tokens_per_s or not dart.tokens_per_s:
            return ""
        parts = [f"DART {dart.tokens_per_s:.1f} tok/s vs plain {plain.tokens_per_s:.1f} tok/s: "
                 f"speedup {dart.tokens_per_s / plain.tokens_per_s:.2f}×, τ {dart.metrics.tau:.2f}"]
        if plain.finished and dart.finished and (why := why_slower(plain.metrics, dart.metrics)):
            parts.append(why)
        pld = session.lanes.get(PLD)
        if pld and pld.tokens_per_s:
            parts.append(f"prompt lookup {pld.tokens_per_s / plain.tokens_per_s:.2f}×")
        if plain.finished and dart.finished and plain.trace.output_ids != dart.trace.output_ids:
            if is_greedy(dart.trace) and dart.status == DONE and plain.status == DONE:
                parts.append("note: the outputs differ (greedy decoding should match; numerical ties can do this)")
        return f'<div class="summary">{html.escape(" · ".join(parts))}</div>'

    def step_view(self, session: Session, key: str | None, index, show_pruned: bool = False) -> dict:
        """Slider, step info, tree, pruning table and draft rows of one step of one lane."""
        lane = session.lane(key)
        if lane is None or not lane.trace.steps:
            empty = figures.message_figure("Run a prompt or upload a trace to see its steps.")
            return {"step": gr.update(maximum=1, value=0), "step_info": "", "tree": empty,
                    "table": pruning_table(Trace(DART, []), 0), "heatmap": empty}
        n = len(lane.trace.steps)
        i = step_index(index, n)
        trace = lane.trace
        return {"step": gr.update(maximum=max(n - 1, 1), value=i), "step_info": self.step_info(lane, i),
                "tree": figures.tree_figure(trace, i, bool(show_pruned)), "table": pruning_table(trace, i),
                "heatmap": figures.rows_heatmap(trace, i)}

    @session_event()
    def animate_step(self, session: Session, key, index, speed=1.0) -> dict:
        """The selected step as an animation that plays in the browser (dart_core.views.animation)."""
        lane = session.lane(key)
        if lane is None or not lane.trace.steps:
            return {"animation": figures.message_figure(NOTHING_TO_ANIMATE)}
        return {"animation": step_animation(lane.trace, step_index(index, len(lane.trace.steps)), _speed(speed))}

    @session_event()
    def autoplay_run(self, session: Session, key, speed=1.0) -> dict:
        """The selected lane's whole run, one frame per step."""
        lane = session.lane(key)
        if lane is None or not lane.trace.steps:
            return {"animation": figures.message_figure(NOTHING_TO_ANIMATE)}
        return {"animation": run_animation(lane.trace, _speed(speed))}

    def step_info(self, lane: Lane, i: int) -> str:
        step, trace = lane.trace.steps[i], lane.trace
        emitted = "".join(token_text(trace, t) for t in step.new_tokens)
        bits = [f"<b>{html.escape(LANES[lane.key].title)} · step {i}</b> of {len(trace.steps) - 1}"]
        if step.kind == "prefill":
            bits.append("prefill: the target read the prompt and chose the first token")
        else:
            bits.append(f"{len(step.tree) - 1 if step.tree else 0} draft nodes, {step.accepted} accepted")
            if step.budget is not None:
                bits.append(html.escape(step.budget.text()))
            miss = figures.step_miss_of(trace, i)
            if miss is not None:
                bits.append('<span class="miss">missed: ' + html.escape(miss.text(lambda t: token_text(trace, t)))
                            + "</span>")
        bits.append(f'emitted <code class="emitted">{html.escape(emitted)}</code>')
        timing = " · ".join(f"{k} {v * 1000:.0f} ms" for k, v in step.timings.items())
        if timing:
            bits.append(html.escape(timing))
        counts = fate_counts(trace, i)
        if counts:
            bits.append("candidates: " + html.escape(", ".join(f"{k} {v}" for k, v in counts.items())))
        if counts and trace.settings.top_candidates is not None:
            bits.append(html.escape(f"this trace was saved with only the best {trace.settings.top_candidates} "
                                    f"candidates of each step (and the tree's own): the counts, the pruned view and "
                                    f"the pruning table show those; what-if still reruns the whole search"))
        if step.stop_reason:
            bits.append(f"stopped: {html.escape(step.stop_reason)}")
        return '<div class="step-info">' + " · ".join(bits) + "</div>" + story_html(trace, i)

    def charts(self, session: Session, key: str | None) -> dict:
        traces = {k: lane.trace for k, lane in session.lanes.items()}
        lane = session.lane(key)
        return {"chart_accept": figures.accepted_length_figure(traces),
                "chart_position": figures.acceptance_by_position_figure(traces),
                "chart_time": figures.time_split_figure(lane.trace, lane.key) if lane else
                figures.message_figure("no run yet"),
                "chart_cost": figures.cost_figure(dart.trace if (dart := session.lanes.get(DART)) else None),
                # the search replays (n-gram weight, beam width) wait for the run's end: streaming stays fluid
                "chart_missed": figures.misses_figure(dart.trace if dart else None, self.engine.ngram,
                                                      replay=bool(dart and dart.finished and not session.running))}

    def lane_pick(self, session: Session, key: str | None = None) -> dict:
        keys = list(session.lanes)
        value = key if key in keys else session.default_lane()
        return {"lane": gr.update(choices=[(LANES[k].title, k) for k in keys], value=value)}

    def whatif_knobs(self, session: Session) -> dict:
        lane = session.lane(DART)
        search = lane.trace.settings.search if lane else None
        if search is None:
            return {}
        out = {}
        for k in TREE_KNOB_NAMES:
            try:
                out[f"wi_{k}"] = check_knob(k, getattr(search, k))
            except OptionError:
                continue
        return out

    def full_view(self, session: Session, show_pruned: bool = False, keep_step: bool = False) -> dict:
        """Every output for the session's current lanes. The step view jumps to the newest step of the default
        lane, unless `keep_step` (the user picked a step during the run: leave it, only widen the slider)."""
        key = session.default_lane()
        index = step_pick.newest(session.lane(key).trace, session.skip_plain) if key else 0
        out = {"state": session, **self.lane_cards(session), "summary": self.summary(session),
               **self.charts(session, key), "downloads": self.save_traces(session), "follow": session.follow}
        if keep_step:
            out["step"] = gr.update(maximum=max(index, 1))
        else:
            out.update(self.lane_pick(session, key))
            out.update(self.step_view(session, key, index, show_pruned))
        return out

    def save_traces(self, session: Session) -> list[str] | None:
        """Write each lane's trace as JSON for download; None when there is nothing to save."""
        lanes = [lane for lane in session.lanes.values() if lane.trace.steps]
        if not lanes:
            return None
        if session.trace_folder:  # keep only the session's latest traces on disk (they are megabytes each)
            shutil.rmtree(session.trace_folder, ignore_errors=True)
        folder = Path(tempfile.mkdtemp(prefix="run-", dir=_ensure(self.trace_dir)))
        session.trace_folder = str(folder)
        paths = []
        for trace in self._finished(lanes):
            path = folder / f"{trace.method}-trace.json.gz"
            trace.save(path)
            paths.append(str(path))
        return paths

    @session_event()
    def export_html(self, session: Session) -> dict:
        """The session's lanes as one self-contained HTML file (dart_core.views.report), offered for download."""
        lanes = [lane for lane in session.lanes.values() if lane.trace.steps]
        if not lanes:
            return {"export": None, **warn("Run a prompt or upload a trace first: there is no run to export yet.")}
        text = report_html(self._finished(lanes), ngram=self.engine.ngram)
        if session.report_folder:  # the previous export: Gradio serves its own copy
            shutil.rmtree(session.report_folder, ignore_errors=True)
        folder = Path(tempfile.mkdtemp(prefix="report-", dir=_ensure(self.trace_dir)))
        session.report_folder = str(folder)
        path = folder / "dart-lab-run.html"
        path.write_text(text, encoding="utf-8")
        return {"export": str(path), "message": message_html(f"Exported the run ({len(text) / 1e6:.1f} MB): one "
                                                               f"HTML file that opens offline.", "info")}

    def _finished(self, lanes: list[Lane]) -> list[Trace]:
        """The lanes' traces, ready to leave the app: every token named, each lane's own time recorded."""
        for lane in lanes:
            lane.trace.name_tokens(self.engine.tokenizer)
            if lane.seconds > 0:
                lane.trace.settings.lane_seconds = round(lane.seconds, 6)
        return [lane.trace for lane in lanes]

    # ------------------------------------------------------------------ events
    def new_lanes(self, request: RunRequest) -> list[Lane]:
        """The lanes of a run (plain decoding, DART, and prompt lookup if asked), ready to step; a DartError says
        what is wrong with the request."""
        r = request
        if not self.engine.can_generate:
            raise EngineError("Replay mode: no model is loaded, so nothing can be generated. "
                              "Upload a saved trace to explore it.")
        prompt = check_prompt(r.prompt)
        sampling = sampling_from(r.temperature, r.top_p, r.top_k, r.seed)
        max_new = check_knob("max_new_tokens", r.max_new_tokens)
        prompt_ids = self.engine.encode(prompt)
        settings = DraftSettings(search_from(r.knobs), bool(r.auto_budget))
        lanes = []
        for key in [VANILLA, DART] + ([PLD] if r.use_pld else []):
            method = self.engine.method_of(key, bool(r.lookup_branch))
            trace = self.engine.new_trace(method, prompt_ids, prompt, sampling, max_new, settings)
            steps = self.engine.steps(method, prompt_ids, sampling, max_new, settings)
            lanes.append(Lane(key, trace, steps, on_step=self.engine.name_step))
        return lanes

    @session_event(tell=False)
    def run(self, session: Session, request: RunRequest) -> Iterator[dict]:
        """Generate with plain decoding and DART (and prompt lookup), interleaved step by step."""
        show_pruned = request.show_pruned
        try:
            lanes = self.new_lanes(request)
        except DartError as exc:
            yield {"state": session, **warn(str(exc))}
            return
        session.new_run(lanes)
        session.run_ended = ended = threading.Event()   # a run's own: one that outlives its Stop cannot end the next
        stop = session.stop
        view_key = DART
        yield {**self.full_view(session, show_pruned), "message": "", "run_btn": gr.update(interactive=False),
               "downloads": None}
        pacer, stepped, messages, new_step = Pacer(self.pace), [], {}, False
        viewed = session.lane(view_key).trace
        to_show = shown = -1   # the viewed lane's step the view would show now, and the one its tree last showed
        try:
            for lane, step in round_robin(lanes, stop, self.engine.lock):
                if lane.key not in stepped:
                    stepped.append(lane.key)
                if step is not None and lane.key == view_key:   # a plain step the view skips changes nothing
                    to_show = step_pick.newest(viewed, session.skip_plain)
                    new_step |= to_show != shown
                if lane.status == ERROR:
                    messages.update(warn(f"{LANES[lane.key].title} failed: {lane.error}"))
                now = time.monotonic()
                if stop.is_set() or not pacer.due(now, lane.finished):
                    continue   # after Stop or Clear no update (theirs is the last), and round_robin ends the lanes
                tree, charts = new_step and pacer.tree_due(now, lane.finished), pacer.charts_due(now)
                view = {**self.frame_view(session, stepped, view_key, show_pruned, tree, charts), **messages}
                pacer.sent(now, tree, charts)
                shown = to_show if tree and session.follow else shown
                yield view
                stepped, messages, new_step = [], {}, new_step and not tree
        finally:
            self.sessions.touch(session)   # idle from the end of the run, not from its start
            ended.set()   # not running: every update of the run was sent (the page asked for the next) or dropped
        if stop.is_set():
            return  # the Stop or Clear handler shows the final state
        yield {**self.full_view(session, show_pruned, keep_step=not session.follow),
               "run_btn": gr.update(interactive=True), **self.whatif_knobs(session)}

    def frame_view(self, session: Session, stepped: list[str], view_key: str, show_pruned: bool, tree: bool,
                   charts: bool) -> dict:
        """A running run's update: the cards of the lanes that `stepped` since the last one, the summary; with `tree`
        the viewed lane's newest step (unless the user picked another: then only the slider's end moves), with
        `charts` the run charts."""
        keys = list(stepped)
        if VANILLA in keys and DART in session.lanes and DART not in keys:   # DART's speedup depends on plain's rate
            keys.append(DART)
        out = {LANE_OUTPUTS[key]: self.lane_card(session, key) for key in keys}
        trace = session.lane(view_key).trace
        if not session.follow:
            out["step"] = gr.update(maximum=max(len(trace.steps) - 1, 1))
        elif tree and trace.steps:
            out.update(self.step_view(session, view_key, step_pick.newest(trace, session.skip_plain), show_pruned))
        if charts:
            out.update(self.charts(session, view_key))
        return {**out, "summary": self.summary(session)}

    def end_run(self, session: Session) -> bool:
        """Stop the session's run, if one runs, and wait until it has ended (True if one ran). It ends after its step
        in flight without another update, or when the page's cancel closes it; either way every update it made was
        sent or dropped by then, so none can reach the page after the view the caller returns."""
        was_running, asked = session.running, time.monotonic()
        session.stop.set()
        if was_running and not session.run_ended.wait(END_WAIT_S):
            log.warning("a stopped run did not end within %s s", END_WAIT_S)
        elif was_running and time.monotonic() - asked > 5:
            log.warning("a stopped run took %.1f s to end", time.monotonic() - asked)
        return was_running

    @session_event()
    def stop(self, session: Session, show_pruned=False) -> dict:
        """Stop the run: the current step finishes, no further step starts; the view shows every step made."""
        was_running = self.end_run(session)
        started = time.monotonic()
        for lane in session.lanes.values():
            if not lane.finished:
                lane.status = STOPPED
        session.running = False
        view = {**self.full_view(session, show_pruned, keep_step=not session.follow),
                "run_btn": gr.update(interactive=True),
                "message": message_html("Stopped. Everything generated so far can be explored and downloaded.",
                                        "info") if was_running else ""}
        if time.monotonic() - started > 5:
            log.warning("Stop's view took %.1f s", time.monotonic() - started)
        return view

    @session_event(tell=False)
    def clear(self, session: Session) -> dict:
        self.end_run(session)
        session.new_run([])
        session.running = False
        empty = figures.message_figure("Run a prompt or upload a trace to see its steps.")
        out = {**self.full_view(session), "prompt": "", "message": "", "run_btn": gr.update(interactive=True),
               "wi_tree": empty, "wi_info": ""}
        return out

    @session_event()
    def show_step(self, session: Session, key, index, show_pruned=False) -> dict:
        return self.step_view(session, key, index, show_pruned)

    @session_event()
    def move_step(self, session: Session, key, index, delta: int, show_pruned=False) -> dict:
        """Prev / next (past the steps without a tree, where the user asks): also stops following the newest step
        while generating."""
        session.follow = False
        lane = session.lane(key)
        try:
            index = step_pick.moved(lane.trace, int(index), delta, session.skip_plain) if lane else 0
        except (TypeError, ValueError):
            index = 0
        return {**self.step_view(session, key, index, show_pruned), "follow": False}

    @session_event()
    def pick_step(self, session: Session, key, index, show_pruned=False) -> dict:
        """The user moved the slider: show that step and stop following the newest one."""
        session.follow = False
        return {**self.step_view(session, key, index, show_pruned), "follow": False}

    @session_event()
    def pick_lane(self, session: Session, key, show_pruned=False) -> dict:
        if session.lane(key) is None:
            return self.step_view(session, None, 0)
        lane = session.lane(key)
        return {**self.step_view(session, lane.key, step_pick.newest(lane.trace, session.skip_plain), show_pruned),
                "chart_time": figures.time_split_figure(lane.trace, lane.key)}

    @session_event(tell=False)
    def set_follow(self, session: Session, follow) -> None:
        session.follow = bool(follow)

    @session_event()
    def set_skip_plain(self, session: Session, key, skip, show_pruned=False) -> dict:
        """Skip the steps without a tree, or not; a view that follows the newest step shows the newest it may."""
        session.skip_plain = bool(skip)
        lane = session.lane(key)
        if not session.follow or lane is None or not lane.trace.steps:
            return {}
        return self.step_view(session, lane.key, step_pick.newest(lane.trace, session.skip_plain), show_pruned)

    @session_event()
    def token_click(self, session: Session, data, show_pruned=False) -> dict:
        """A token in a lane was clicked: open its lane and step."""
        if not isinstance(data, dict):
            return {}
        key, index = data.get("lane"), data.get("step")
        if key not in session.lanes:
            return {}
        try:
            index = int(index)
        except (TypeError, ValueError):
            return {}
        session.follow = False
        return {**self.lane_pick(session, key), **self.step_view(session, key, index, show_pruned), "follow": False}

    @session_event(tell=False)
    def upload(self, session: Session, files, show_pruned=False) -> dict:
        """Replay saved traces (one per lane; a lane is chosen by the trace's method)."""
        paths = [files] if isinstance(files, (str, Path)) else list(files or [])
        if not paths:
            return {"state": session}
        traces, errors = {}, []
        for path in paths:
            name = Path(str(path)).name
            try:
                if Path(path).stat().st_size > MAX_TRACE_BYTES:
                    raise TraceError(f"the file is larger than {MAX_TRACE_BYTES >> 20} MiB")
                trace = Trace.load(path)
                check_trace(trace)
            except (DartError, OSError) as exc:
                errors.append(f"{name}: {exc}")
                continue
            traces[lane_of(trace.method)] = trace
        if not traces:
            return {"state": session, **warn("Could not load the trace: " + "; ".join(errors))}
        session.new_run([replay_lane(t) for t in traces.values()])
        out = {**self.full_view(session, show_pruned), **self.whatif_knobs(session),
               "message": message_html("Loaded " + ", ".join(LANES[k].title for k in session.lanes) + " for replay."
                                       + (" Skipped: " + "; ".join(errors) if errors else ""),
                                       "error" if errors else "info")}
        if errors:
            gr.Warning(html.escape("Skipped: " + "; ".join(errors)))
        return out

    @session_event()
    def what_if(self, session: Session, key, index, knobs: dict) -> dict:
        """Rerun the search of the selected step with other knobs (the tree knobs by name; the new tree is verified
        if a model is here)."""
        lane = session.lane(key)
        if lane is None or not lane.trace.steps:
            return warn("Run a prompt or upload a trace first, then pick a DART step.")
        if lane.key != DART:
            return warn("What-if needs a DART step: pick the DART lane.")
        try:
            cfg = search_from(knobs)
            i = int(index)
            trace = lane.trace
            verifier = None
            if self._same_model(trace):
                verifier = self.engine.verifier(trace.settings.sampling)
            result = what_if(trace, i, cfg, self.engine.ngram, frozenset(trace.settings.stop_ids), verifier)
        except DartError as exc:
            return warn(str(exc))
        if result.bonus is not None:
            trace.name_tokens(self.engine.tokenizer, [result.bonus])
        step = trace.steps[i]
        title = f"What-if on step {i}: {len(result.tree) - 1} draft nodes, {result.accepted} accepted"
        view = figures.tree_view(trace, result.tree, result.path, result.bonus, result.candidates, result.context,
                                 result.lookup_nodes, figures.TreeOptions(title))
        fig = figures.tree_figure_from_view(view)
        would = "".join(token_text(trace, result.tree.tokens[n]) for n in result.path[1:])
        rec = "".join(token_text(trace, t) for t in step.new_tokens[: step.accepted])
        lines = [f"<b>Recorded</b>: {len(step.tree) - 1} nodes, {step.accepted} accepted "
                 f'<code class="emitted">{html.escape(rec)}</code>',
                 f"<b>What-if</b>: {len(result.tree) - 1} nodes, {result.accepted} accepted "
                 f'<code class="emitted">{html.escape(would)}</code> ({html.escape(HOW_TEXT[result.how])})']
        lines += [html.escape(n) for n in result.notes]
        return {"wi_tree": fig, "wi_info": '<div class="step-info">' + "<br>".join(lines) + "</div>", "message": ""}

    def _same_model(self, trace: Trace) -> bool:
        if not self.engine.can_generate:
            return False
        mine, theirs = self.engine.loaded, trace.settings
        return (theirs.model, theirs.dtype) == (mine.model, mine.dtype) and \
            max(trace.mentioned_tokens(), default=0) < self.engine.target.vocab_size


def step_index(index, n: int) -> int:
    """A step number from the slider, within 0..n-1 (the newest step when it is not a number)."""
    try:
        return min(max(int(index), 0), n - 1)
    except (TypeError, ValueError):
        return n - 1


def _speed(value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 1.0
    return value if value in SPEEDS else 1.0


def _ensure(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder
