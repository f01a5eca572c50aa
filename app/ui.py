"""The app: the page (`app.layout`) around one shared engine, and its event wiring. The handlers live in
`app.callbacks` and return dicts of output names; `Binder` maps those names onto the page's components (and turns any
unexpected error into a message)."""

from __future__ import annotations

import functools
import html
import inspect
import logging
from pathlib import Path

import gradio as gr

from dart_core.trace import Trace
from dart_core.views.text_render import lane_css

from .api import run_api
from .callbacks import (CHART_OUTPUTS, LANE_OUTPUTS, MAX_TRACE_BYTES, STEP_OUTPUTS, WHATIF_OUTPUTS, Callbacks,
                        message_html)
from .engine import Engine
from .health import health
from .lanes import replay_lane
from .layout import Components, page
from .options import TREE_KNOB_NAMES
from .request import RUN_FIELDS, RunRequest
from .session import SessionStore

log = logging.getLogger(__name__)

CSS_PATH = Path(__file__).with_name("style.css")
# Every component a full view may update (run, stop, clear, upload, page load).
OUTPUT_NAMES = ("state", "message", *LANE_OUTPUTS.values(), "summary", "lane", *STEP_OUTPUTS, "follow", *CHART_OUTPUTS,
                "downloads", "run_btn", "prompt", *WHATIF_OUTPUTS, "wi_tree", "wi_info")
MODEL_EVENTS = "model"  # one concurrency group for everything that drives the model
# The page's own events answer with the page's components (HTML, figures) and act on its session: callable (the soak
# drives `/page_run` as a visitor would) but left out of the API's docs, where `/run` (app.api) and `/health` are.
HIDDEN = {"api_visibility": "undocumented"}


def launch_kwargs(sessions: SessionStore) -> dict:
    """What `launch()` needs besides host and port: the stylesheet, the lanes' colour rules and the theme (Gradio 6
    takes them there), and a bound on the pages whose data Gradio itself keeps (the last value of every component,
    kept until evicted: its default is 10,000 pages; twice the sessions held leaves room for pages that never ran
    anything; a page whose session was freed keeps only its state there: `forget_page_copy`)."""
    return {"css_paths": [CSS_PATH], "css": lane_css(),
            "theme": gr.themes.Soft(primary_hue="orange", secondary_hue="blue"),
            "ssr_mode": False, "max_file_size": MAX_TRACE_BYTES, "state_session_capacity": 2 * sessions.max_sessions}


def run_inputs(c: Components) -> list:
    """The Run button's inputs: the session, then the request's fields in RUN_FIELDS order."""
    return [c["state"], *(c[name] for name in RUN_FIELDS)]


class Binder:
    """Wraps callbacks for the page: a callback's name->value dict goes onto the components of those names (only the
    names it may update); an unexpected error becomes a message, never a traceback on the page."""

    def __init__(self, comps: Components):
        self.comps = comps

    def __call__(self, fn, names_out):
        def convert(result):
            return {self.comps[k]: v for k, v in (result or {}).items() if k in self.comps and k in names_out}

        def failed(exc):
            log.exception("callback %s failed", getattr(fn, "__name__", fn))
            text = f"Something went wrong: {type(exc).__name__}: {exc} (the details are in the server log)"
            gr.Warning(html.escape(text))
            return convert({"message": message_html(text), "run_btn": gr.update(interactive=True)})

        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def gen(*args):
                try:
                    for result in fn(*args):
                        yield convert(result)
                except Exception as exc:  # noqa: BLE001 - the page must never show a traceback
                    yield failed(exc)
            return gen

        @functools.wraps(fn)
        def call(*args):
            try:
                return convert(fn(*args))
            except Exception as exc:  # noqa: BLE001
                return failed(exc)
        return call

    def outputs(self, names) -> list:
        return [self.comps[k] for k in names]


def build_app(engine: Engine, preload: list[Trace] | None = None, trace_dir=None,
              sessions: SessionStore | None = None) -> gr.Blocks:
    """The whole app around one shared engine. `preload`: traces every new session starts with (replay);
    `sessions`: the store that frees idle and closed sessions (app.session)."""
    # The session folders live inside Gradio's file cache: Gradio serves a file there as it is, where it would copy
    # a file from elsewhere into its cache (a copy per download, never deleted while the process runs).
    cb = Callbacks(engine, trace_dir or Path(gr.utils.get_upload_folder()) / "dart-lab-sessions", sessions)
    ttl = cb.sessions.ttl_s
    # delete_cache: Gradio's copies of served and uploaded files are removed once older than two session lifetimes
    # (a page kept alive by its visitor keeps its session, and its links for a while longer).
    with gr.Blocks(title="DART Lab", fill_width=True, delete_cache=(max(1, int(ttl / 2)), int(2 * ttl))) as demo:
        bind = Binder(page(engine, cb))
        wire_run(cb, bind)
        wire_steps(cb, bind)
        wire_files_and_views(cb, bind)
        wire_page(cb, bind, demo, preload)
    cb.sessions.on_free = functools.partial(forget_page_copy, demo, bind.comps["state"])
    return demo


def forget_page_copy(demo: gr.Blocks, state: gr.State, session) -> None:
    """Gradio keeps, for every page, a copy of every component's configuration with its latest value (for deep links,
    which this app does not offer): about 1 MB of JSON a page, ten plots' figures most of it, kept until
    `state_session_capacity` newer pages push the page out, closed or not. When the store frees a session, that copy
    of its page goes too (Gradio makes an entry again for a component the page updates later); the page's state
    stays: the freed session, which tells a visitor who comes back why their run is gone."""
    pages = getattr(getattr(demo, "state_holder", None), "session_data", {})
    for held in list(pages.values()):   # a snapshot (one call in C): Gradio adds pages from other threads
        if held.state_data.get(state._id) is session:
            held.config_values.clear()
            # and the component copies a streamed run left under ids the page does not have (a few every step)
            for key in [key for key in held.blocks_config.blocks if key not in demo.blocks]:
                del held.blocks_config.blocks[key]


def wire_run(cb: Callbacks, bind: Binder) -> None:
    """Run (the button, or Enter in the prompt), Stop and Clear."""
    c, all_out = bind.comps, bind.outputs(OUTPUT_NAMES)

    def run(session, *values):
        """The page's Run: the request's fields as the page sends them, in RUN_FIELDS order."""
        yield from cb.run(session, RunRequest.from_values(*values))

    run = bind(run, OUTPUT_NAMES)
    # One model, one run at a time across all sessions: the others wait in the queue, their place and the wait
    # shown on the lanes ("minimal" keeps that text in the page but does not show it).
    model_event = {"concurrency_limit": 1, "concurrency_id": MODEL_EVENTS, "show_progress": "full",
                   "show_progress_on": [c["lane_vanilla"], c["lane_dart"]]}
    run_evt = c["run_btn"].click(run, run_inputs(c), all_out, api_name="page_run", **model_event, **HIDDEN)
    submit_evt = c["prompt"].submit(run, run_inputs(c), all_out, api_name="page_submit", **model_event, **HIDDEN)
    c["stop_btn"].click(bind(cb.stop, OUTPUT_NAMES), [c["state"], c["show_pruned"]], all_out,
                        cancels=[run_evt, submit_evt], api_name="stop", **HIDDEN)
    c["clear_btn"].click(bind(cb.clear, OUTPUT_NAMES), [c["state"]], all_out, cancels=[run_evt, submit_evt],
                         api_name="clear", **HIDDEN)
    c["example"].input(lambda text: text or gr.skip(), [c["example"]], [c["prompt"]], **HIDDEN)


def wire_steps(cb: Callbacks, bind: Binder) -> None:
    """Picking a lane and a step (slider, buttons, a click on a token) and how the step is shown."""
    c = bind.comps
    step_names = [*STEP_OUTPUTS, "follow"]
    step_out = bind.outputs(step_names)
    view_in = [c["state"], c["lane"], c["step"], c["show_pruned"]]
    # .input: user changes only (drag or typed number), not the run's own updates; drags coalesce.
    c["step"].input(bind(cb.pick_step, step_names), view_in, step_out, trigger_mode="always_last",
                    show_progress="hidden", api_name="pick_step", **HIDDEN)
    c["prev_btn"].click(bind(functools.partial(_move, cb, -1), step_names), view_in, step_out, **HIDDEN)
    c["next_btn"].click(bind(functools.partial(_move, cb, 1), step_names), view_in, step_out, **HIDDEN)
    c["show_pruned"].change(bind(cb.show_step, step_names), view_in, step_out, **HIDDEN)
    c["lane"].input(bind(cb.pick_lane, [*step_names, "chart_time"]), [c["state"], c["lane"], c["show_pruned"]],
                    [*step_out, c["chart_time"]], **HIDDEN)
    c["follow"].input(cb.set_follow, [c["state"], c["follow"]], None, **HIDDEN)
    skip_in = [c["state"], c["lane"], c["skip_plain"], c["show_pruned"]]
    c["skip_plain"].input(bind(cb.set_skip_plain, STEP_OUTPUTS), skip_in, bind.outputs(STEP_OUTPUTS), **HIDDEN)
    token_names = [*step_names, "lane"]

    def on_token(session, show_pruned, evt: gr.EventData):
        return bind(lambda s, p: cb.token_click(s, getattr(evt, "_data", None), p), token_names)(
            session, show_pruned)

    for key in LANE_OUTPUTS.values():
        c[key].click(on_token, [c["state"], c["show_pruned"]], bind.outputs(token_names), **HIDDEN)


def wire_files_and_views(cb: Callbacks, bind: Binder) -> None:
    """Upload and export, the animations and what-if."""
    c = bind.comps
    view_in = [c["state"], c["lane"], c["step"]]
    c["upload"].upload(bind(cb.upload, OUTPUT_NAMES), [c["state"], c["upload"], c["show_pruned"]],
                       bind.outputs(OUTPUT_NAMES), **HIDDEN)
    c["export_btn"].click(bind(cb.export_html, ["export", "message"]), [c["state"]], [c["export"], c["message"]],
                          api_name="export_html", **HIDDEN)
    anim_names = ["animation", "message"]
    c["anim_btn"].click(bind(_as_json(cb.animate_step), anim_names), [*view_in, c["anim_speed"]],
                        bind.outputs(anim_names), api_name="animate_step", **HIDDEN)
    c["autoplay_btn"].click(bind(_as_json(cb.autoplay_run), anim_names), [c["state"], c["lane"], c["anim_speed"]],
                            bind.outputs(anim_names), api_name="autoplay_run", **HIDDEN)
    wi_names = ["wi_tree", "wi_info", "message"]
    c["wi_btn"].click(bind(functools.partial(_what_if, cb), wi_names), [*view_in, *(c[k] for k in WHATIF_OUTPUTS)],
                      bind.outputs(wi_names), concurrency_limit=1, concurrency_id=MODEL_EVENTS, api_name="what_if",
                      **HIDDEN)


def wire_page(cb: Callbacks, bind: Binder, demo: gr.Blocks, preload: list[Trace] | None) -> None:
    """A page opening (its session, the preloaded traces, the tour) and closing, and the health API."""
    c = bind.comps

    def start(show_pruned, request: gr.Request):
        session = cb.sessions.open(getattr(request, "session_hash", None))
        if preload:
            session.new_run([replay_lane(Trace.from_dict(t.to_dict())) for t in preload])
            return {**cb.full_view(session, show_pruned), **cb.whatif_knobs(session)}
        return {"state": session}

    def page_closed(request: gr.Request):
        """The page was closed (or reloaded): its session is freed now, not after the idle time."""
        if getattr(request, "session_hash", None):
            cb.sessions.close(request.session_hash)

    def app_health() -> dict:
        """What the app holds now: sessions, folders, Gradio's pages and file cache, memory (app.health)."""
        holder = getattr(demo, "state_holder", None)
        return health(cb.sessions, cb.trace_dir, getattr(demo, "GRADIO_CACHE", None),
                      len(getattr(holder, "session_data", ())))

    demo.load(bind(start, OUTPUT_NAMES), [c["show_pruned"]], bind.outputs(OUTPUT_NAMES), **HIDDEN)
    demo.unload(page_closed)
    gr.api(app_health, api_name="health", queue=False)
    gr.api(run_api(cb), api_name="run", concurrency_limit=1, concurrency_id=MODEL_EVENTS)
    demo.load(show_tour, [c["tour_seen"]], [c["tour"]], **HIDDEN)
    c["tour_ok"].click(dismiss_tour, None, [c["tour_seen"], c["tour"]], **HIDDEN)
    c["tour_again"].click(lambda: gr.update(visible=True), None, [c["tour"]], **HIDDEN)


def show_tour(seen) -> dict:
    return gr.update(visible=not seen)


def dismiss_tour() -> tuple:
    """Got it: remembered in the browser, so the tour stays hidden on the next visits."""
    return True, gr.update(visible=False)


def _as_json(fn):
    """A callback whose "animation" figure goes to the page as JSON (see ANIMATION_JS)."""
    @functools.wraps(fn)
    def call(*args):
        out = fn(*args)
        return {**out, "animation": out["animation"].to_json()}
    return call


def _what_if(cb: Callbacks, session, key, index, *knob_values):
    """What-if's inputs: the lane, the step, then the tree knobs in TREE_KNOB_NAMES order."""
    return cb.what_if(session, key, index, dict(zip(TREE_KNOB_NAMES, knob_values)))


def _move(cb: Callbacks, delta: int, session, key, index, show_pruned):
    return cb.move_step(session, key, index, delta, show_pruned)
