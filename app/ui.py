"""The Blocks layout and its event wiring. The handlers live in `app.callbacks` and return dicts of output
names; `_bind` maps those names onto this layout's components (and turns any unexpected error into a message)."""

from __future__ import annotations

import functools
import html
import inspect
import logging
from pathlib import Path

import gradio as gr

from dart_core.methods import PLD
from dart_core.trace import Trace
from dart_core.views import figures
from dart_core.views.animation import SPEEDS
from dart_core.views.pruning import COLUMNS
from dart_core.views.text_render import LEGEND_HTML

from .callbacks import (CHART_OUTPUTS, LANE_OUTPUTS, MAX_TRACE_BYTES, STEP_OUTPUTS, WHATIF_KNOBS, WHATIF_OUTPUTS,
                        Callbacks, message_html)
from .engine import Engine
from .explain import CHARTS_TAB, GLOSSARY_TAB, PRUNING_TAB, TREE_TAB, WHATIF_TAB, glossary_html, tour_html
from .lanes import replay_lane
from .options import EXAMPLES, KNOBS, SAMPLING_KNOBS, TREE_KNOBS
from .health import health
from .session import Session, SessionStore

log = logging.getLogger(__name__)

CSS_PATH = Path(__file__).with_name("style.css")
HELP_PATH = Path(__file__).with_name("help.md")
# Every component a full view may update (run, stop, clear, upload, page load).
OUTPUT_NAMES = ("state", "message", *LANE_OUTPUTS.values(), "summary", "lane", *STEP_OUTPUTS, "follow", *CHART_OUTPUTS,
                "downloads", "run_btn", "prompt", *WHATIF_OUTPUTS, "wi_tree", "wi_info")
MODEL_EVENTS = "model"  # one concurrency group for everything that drives the model
EXAMPLE_CHOICES = [(f"{cat}: {text}", text) for cat, text in EXAMPLES]
# Clicking a token in a lane sends its lane and step (event delegation: the lane HTML is re-rendered often).
TOKEN_CLICK_JS = """
element.addEventListener('click', (e) => {
  const t = e.target.closest('[data-step]');
  if (t) trigger('click', {lane: t.dataset.lane, step: Number(t.dataset.step)});
});
"""

# gr.Plot draws with Plotly.react(data, layout) and drops a figure's frames, so the animations are drawn here, frames
# and all, from their JSON, and start playing. Plotly is the copy Gradio's own plots load (the token tree's plot is
# there from the start).
ANIMATION_JS = """
const draw = (tries = 0) => {
  const div = element.querySelector('.anim-plot');
  if (!props.value || !div) return;
  if (!window.Plotly) {
    if (tries < 50) setTimeout(() => draw(tries + 1), 200);
    return;
  }
  const fig = JSON.parse(props.value);
  const play = fig.layout.updatemenus?.[0]?.buttons?.[0]?.args;   // the Play button's: start at its speed
  window.Plotly.newPlot(div, {data: fig.data, layout: fig.layout, frames: fig.frames || [],
                              config: {displaylogo: false, responsive: true}})
    .then(() => play && window.Plotly.animate(div, ...play));
};
watch('value', () => draw());
draw();
"""


def _slider(knob, prefix: str = "", **kw) -> gr.Slider:
    return gr.Slider(knob.minimum, knob.maximum, value=knob.default, step=knob.step, label=knob.label,
                     info=knob.info or None, elem_id=prefix + knob.name.replace("_", "-"), **kw)


def launch_kwargs(sessions: SessionStore) -> dict:
    """What `launch()` needs besides host and port: the stylesheet and the theme (Gradio 6 takes them there), and a
    bound on the pages whose data Gradio itself keeps (the last value of every component, kept until evicted: its
    default is 10,000 pages; twice the sessions held leaves room for pages that never ran anything)."""
    return {"css_paths": [CSS_PATH], "theme": gr.themes.Soft(primary_hue="orange", secondary_hue="blue"),
            "ssr_mode": False, "max_file_size": MAX_TRACE_BYTES, "state_session_capacity": 2 * sessions.max_sessions}


def build_app(engine: Engine, preload: list[Trace] | None = None, trace_dir=None,
              sessions: SessionStore | None = None) -> gr.Blocks:
    """The whole app around one shared engine. `preload`: traces every new session starts with (replay);
    `sessions`: the store that frees idle and closed sessions (app.session)."""
    # The session folders live inside Gradio's file cache: Gradio serves a file there as it is, where it would copy
    # a file from elsewhere into its cache (a copy per download, never deleted while the process runs).
    cb = Callbacks(engine, trace_dir or Path(gr.utils.get_upload_folder()) / "dart-lab-sessions", sessions)
    ttl = cb.sessions.ttl_s
    comps: dict[str, gr.components.Component] = {}

    def _bind(fn, names_out):
        """Wrap a callback: map its name->value dict onto components; unexpected errors become a message."""
        def convert(result):
            return {comps[k]: v for k, v in (result or {}).items() if k in comps and k in names_out}

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

    # delete_cache: Gradio's copies of served and uploaded files are removed once older than two session lifetimes
    # (a page kept alive by its visitor keeps its session, and its links for a while longer).
    with gr.Blocks(title="DART Lab", fill_width=True, delete_cache=(max(1, int(ttl / 2)), int(2 * ttl))) as demo:
        comps["state"] = gr.State(None)
        gr.Markdown("# DART Lab\nPlain decoding and **DART** speculative decoding side by side, and every draft "
                    "tree DART built, step by step.", elem_classes="app-header")
        notices = list(engine.notices)
        if engine.can_generate:
            notices.insert(0, engine.describe())
        gr.HTML("".join(f'<div class="notice">{html.escape(n)}</div>' for n in notices), elem_id="notices")
        comps["message"] = gr.HTML("", elem_id="message")
        # The first-visit tour: shown on load unless this browser dismissed it before (kept in its local storage).
        tour_seen = gr.BrowserState(False, storage_key="dart-lab-tour-seen")
        with gr.Column(visible=False, variant="panel", elem_id="tour") as tour:
            gr.HTML(tour_html())
            tour_ok = gr.Button("Got it", size="sm", elem_id="tour-ok")

        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=300):
                comps["prompt"] = gr.Textbox(label="Prompt", lines=4, max_lines=12, elem_id="prompt",
                                             placeholder="Ask something, or pick an example below",
                                             interactive=engine.can_generate)
                with gr.Row():
                    comps["run_btn"] = gr.Button("Run", variant="primary", elem_id="run-btn", min_width=60,
                                                 interactive=engine.can_generate)
                    comps["stop_btn"] = gr.Button("Stop", variant="stop", elem_id="stop-btn", min_width=60)
                    comps["clear_btn"] = gr.Button("Clear", elem_id="clear-btn", min_width=60)
                comps["example"] = gr.Dropdown(EXAMPLE_CHOICES, value=None, label="Example prompts",
                                               elem_id="examples", interactive=engine.can_generate)
                comps["use_pld"] = gr.Checkbox(label="Third lane: prompt lookup", value=False, elem_id="use-pld")
                comps["lookup_branch"] = gr.Checkbox(
                    label="DART + lookup branch", value=False, elem_id="lookup-branch",
                    info="add prompt lookup's copied continuation to every DART tree (not in the paper)")
                with gr.Accordion("Sampling", open=False):
                    for knob in SAMPLING_KNOBS:
                        comps[knob.name] = _slider(knob)
                with gr.Accordion("Tree knobs", open=False):
                    comps["auto_budget"] = gr.Checkbox(
                        label="Automatic node budget", value=True, elem_id="auto-budget",
                        info="chosen as the run goes for the most tokens per second on this machine; the node "
                             "budget below is where it starts")
                    for knob in TREE_KNOBS:
                        comps[knob.name] = _slider(knob)
                with gr.Accordion("Traces: download or replay", open=not engine.can_generate):
                    comps["downloads"] = gr.File(label="Download the traces (JSON)", file_count="multiple",
                                                 interactive=False, elem_id="downloads")
                    comps["upload"] = gr.File(label="Upload traces to replay", file_count="multiple",
                                              file_types=[".json"], elem_id="upload")
                    comps["export_btn"] = gr.Button("Export HTML", size="sm", elem_id="export-btn")
                    comps["export"] = gr.File(label="The run as one HTML file (opens offline, to share)",
                                              interactive=False, elem_id="export-file")
                with gr.Accordion("How to read the tree", open=False):
                    gr.Markdown(HELP_PATH.read_text(encoding="utf-8"))
            with gr.Column(scale=4):
                gr.HTML(LEGEND_HTML, elem_id="legend")
                with gr.Row(equal_height=False, elem_id="lanes"):
                    for key in LANE_OUTPUTS:
                        comps[LANE_OUTPUTS[key]] = gr.HTML(
                            cb.lane_card(Session(), key), elem_id=f"lane-{key}", elem_classes="lane-box",
                            js_on_load=TOKEN_CLICK_JS, visible=key != PLD, min_width=260)
                comps["summary"] = gr.HTML("", elem_id="summary")
                with gr.Row(equal_height=False, elem_id="step-controls"):
                    comps["lane"] = gr.Radio([], label="Lane", scale=2, min_width=200, elem_id="lane-pick")
                    comps["step"] = gr.Slider(0, 1, value=0, step=1, label="Step", scale=5, elem_id="step-slider")
                    with gr.Column(scale=2, min_width=220):
                        with gr.Row():
                            comps["prev_btn"] = gr.Button("◀ Prev", size="sm", min_width=70, elem_id="prev-btn")
                            comps["next_btn"] = gr.Button("Next ▶", size="sm", min_width=70, elem_id="next-btn")
                        comps["follow"] = gr.Checkbox(label="Follow the newest step", value=True, elem_id="follow",
                                                      container=False)
                        comps["show_pruned"] = gr.Checkbox(label="Show pruned candidates", value=False,
                                                           elem_id="show-pruned", container=False)
                comps["step_info"] = gr.HTML("", elem_id="step-info")
                with gr.Tabs():
                    with gr.Tab(TREE_TAB):
                        comps["tree"] = gr.Plot(figures.message_figure("Run a prompt or upload a trace to see its "
                                                                       "steps."), show_label=False, elem_id="tree-plot")
                        # Drawn only on a click, for the selected step: streaming stays as fast as before.
                        with gr.Accordion("Animate: this step being built, or the whole run", open=False):
                            with gr.Row():
                                comps["anim_speed"] = gr.Dropdown([(f"{x:g}×", x) for x in SPEEDS], value=1.0,
                                                                  label="Speed", min_width=100, elem_id="anim-speed")
                                comps["anim_btn"] = gr.Button("Animate step", elem_id="animate-btn")
                                comps["autoplay_btn"] = gr.Button("Autoplay run", elem_id="autoplay-btn")
                            comps["animation"] = gr.HTML("", html_template='<div class="anim-plot"></div>',
                                                         js_on_load=ANIMATION_JS, elem_id="animation-plot")
                    with gr.Tab(PRUNING_TAB):
                        comps["table"] = gr.Dataframe(headers=list(COLUMNS), label="Best candidates per draft row",
                                                      interactive=False, wrap=True, max_height=440,
                                                      column_widths=["6%", "5%", "14%", "12%", "7%", "7%", "7%",
                                                                     "8%", "7%", "7%", "10%", "10%"],
                                                      elem_id="prune-table")
                        comps["heatmap"] = gr.Plot(label="Draft rows", elem_id="rows-plot")
                    with gr.Tab(CHARTS_TAB):
                        for name in CHART_OUTPUTS:
                            comps[name] = gr.Plot(show_label=False, elem_id=name.replace("_", "-"))
                    with gr.Tab(WHATIF_TAB):
                        gr.Markdown("Change the tree knobs and rerun only the search of the selected DART step: the "
                                    "draft rows are reused as recorded. With the model loaded the new tree is "
                                    "verified by one target forward; without it, a greedy trace still tells exactly "
                                    "what would be accepted.")
                        with gr.Row():
                            for name in WHATIF_KNOBS:
                                comps[f"wi_{name}"] = _slider(KNOBS[name], "wi-", min_width=160)
                        comps["wi_btn"] = gr.Button("Rerun the search of this step", elem_id="whatif-btn")
                        comps["wi_info"] = gr.HTML("", elem_id="whatif-info")
                        comps["wi_tree"] = gr.Plot(show_label=False, elem_id="whatif-plot")
                    with gr.Tab(GLOSSARY_TAB):
                        gr.HTML(glossary_html(), elem_id="glossary")
                        tour_again = gr.Button("Show the tour again", size="sm", elem_id="tour-again")

        c = comps
        all_out = [c[k] for k in OUTPUT_NAMES]
        step_names = [*STEP_OUTPUTS, "follow"]
        step_out = [c[k] for k in step_names]
        view_in = [c["state"], c["lane"], c["step"], c["show_pruned"]]
        hidden = {"api_visibility": "undocumented"}
        run_inputs = [c["state"], c["prompt"], c["use_pld"], *(c[k.name] for k in SAMPLING_KNOBS),
                      *(c[k.name] for k in TREE_KNOBS), c["show_pruned"], c["lookup_branch"], c["auto_budget"]]
        run = _bind(cb.run, OUTPUT_NAMES)
        # One model, one run at a time across all sessions: the others wait in the queue, their place and the wait
        # shown on the lanes ("minimal" keeps that text in the page but does not show it).
        model_event = {"concurrency_limit": 1, "concurrency_id": MODEL_EVENTS, "show_progress": "full",
                       "show_progress_on": [c["lane_vanilla"], c["lane_dart"]]}
        run_evt = c["run_btn"].click(run, run_inputs, all_out, api_name="run", **model_event)
        submit_evt = c["prompt"].submit(run, run_inputs, all_out, **model_event, **hidden)
        c["stop_btn"].click(_bind(cb.stop, OUTPUT_NAMES), [c["state"], c["show_pruned"]], all_out,
                            cancels=[run_evt, submit_evt], api_name="stop")
        c["clear_btn"].click(_bind(cb.clear, OUTPUT_NAMES), [c["state"]], all_out, cancels=[run_evt, submit_evt],
                             api_name="clear")
        # .input: user changes only (drag or typed number), not the run's own updates; drags coalesce.
        c["step"].input(_bind(cb.pick_step, step_names), view_in, step_out, trigger_mode="always_last",
                        show_progress="hidden", api_name="pick_step")
        c["prev_btn"].click(_bind(functools.partial(_move, cb, -1), step_names), view_in, step_out, **hidden)
        c["next_btn"].click(_bind(functools.partial(_move, cb, 1), step_names), view_in, step_out, **hidden)
        c["show_pruned"].change(_bind(cb.show_step, step_names), view_in, step_out, **hidden)
        c["lane"].input(_bind(cb.pick_lane, [*step_names, "chart_time"]), [c["state"], c["lane"], c["show_pruned"]],
                        [*step_out, c["chart_time"]], **hidden)
        c["example"].input(lambda text: text or gr.skip(), [c["example"]], [c["prompt"]], **hidden)
        c["follow"].input(cb.set_follow, [c["state"], c["follow"]], None, **hidden)
        token_names = [*step_names, "lane"]

        def on_token(session, show_pruned, evt: gr.EventData):
            return _bind(lambda s, p: cb.token_click(s, getattr(evt, "_data", None), p), token_names)(
                session, show_pruned)

        for key in LANE_OUTPUTS.values():
            c[key].click(on_token, [c["state"], c["show_pruned"]], [c[k] for k in token_names], **hidden)
        c["upload"].upload(_bind(cb.upload, OUTPUT_NAMES), [c["state"], c["upload"], c["show_pruned"]], all_out,
                           **hidden)
        c["export_btn"].click(_bind(cb.export_html, ["export", "message"]), [c["state"]],
                              [c["export"], c["message"]], api_name="export_html")
        anim_names = ["animation", "message"]
        c["anim_btn"].click(_bind(_as_json(cb.animate_step), anim_names), [*view_in[:3], c["anim_speed"]],
                            [c[k] for k in anim_names], api_name="animate_step")
        c["autoplay_btn"].click(_bind(_as_json(cb.autoplay_run), anim_names), [c["state"], c["lane"], c["anim_speed"]],
                                [c[k] for k in anim_names], api_name="autoplay_run")
        wi_names = ["wi_tree", "wi_info", "message"]
        c["wi_btn"].click(_bind(cb.what_if, wi_names), [*view_in[:3], *(c[f"wi_{k}"] for k in WHATIF_KNOBS)],
                          [c[k] for k in wi_names], concurrency_limit=1, concurrency_id=MODEL_EVENTS,
                          api_name="what_if")

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

        demo.load(_bind(start, OUTPUT_NAMES), [c["show_pruned"]], all_out, **hidden)
        demo.unload(page_closed)
        gr.api(app_health, api_name="health", queue=False)
        demo.load(show_tour, [tour_seen], [tour], **hidden)
        tour_ok.click(dismiss_tour, None, [tour_seen, tour], **hidden)
        tour_again.click(lambda: gr.update(visible=True), None, [tour], **hidden)
    return demo


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


def _move(cb: Callbacks, delta: int, session, key, index, show_pruned):
    return cb.move_step(session, key, index, delta, show_pruned)
