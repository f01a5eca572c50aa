"""The page's layout, a section at a time: each function builds one part of the page inside the Blocks being built
and returns its components by name (the names the callbacks' output dicts use). `app.ui` puts them together and wires
the events."""

from __future__ import annotations

import html
from pathlib import Path

import gradio as gr

from dart_core.methods import PLD
from dart_core.setup.datasets import EXAMPLES
from dart_core.tree_search import Knob
from dart_core.views import figures
from dart_core.views.animation import SPEEDS
from dart_core.views.pruning import COLUMNS
from dart_core.views.text_render import LEGEND_HTML

from .callbacks import CHART_OUTPUTS, LANE_OUTPUTS, Callbacks
from .engine import Engine
from .explain import CHARTS_TAB, GLOSSARY_TAB, PRUNING_TAB, TREE_TAB, WHATIF_TAB, glossary_html, tour_html
from .options import SAMPLING_KNOBS, TREE_KNOBS
from .session import Session

Components = dict[str, gr.components.Component]
HELP_PATH = Path(__file__).with_name("help.md")
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



def _slider(knob: Knob, prefix: str = "", **kw) -> gr.Slider:
    return gr.Slider(knob.minimum, knob.maximum, value=knob.default, step=knob.step, label=knob.label,
                     info=knob.help or None, elem_id=prefix + knob.name.replace("_", "-"), **kw)


def header(engine: Engine) -> Components:
    """The title, what is loaded (and any notice), the message line, and the first-visit tour: shown on load unless
    this browser dismissed it before (kept in its local storage)."""
    gr.Markdown("# DART Lab\nPlain decoding and **DART** speculative decoding side by side, and every draft "
                "tree DART built, step by step.", elem_classes="app-header")
    notices = list(engine.notices)
    if engine.can_generate:
        notices.insert(0, engine.describe())
    gr.HTML("".join(f'<div class="notice">{html.escape(n)}</div>' for n in notices), elem_id="notices")
    c = {"message": gr.HTML("", elem_id="message"),
         "tour_seen": gr.BrowserState(False, storage_key="dart-lab-tour-seen")}
    with gr.Column(visible=False, variant="panel", elem_id="tour") as c["tour"]:
        gr.HTML(tour_html())
        c["tour_ok"] = gr.Button("Got it", size="sm", elem_id="tour-ok")
    return c


def run_controls(engine: Engine) -> Components:
    """The prompt, Run / Stop / Clear, the examples, the lanes to run and the knobs."""
    c = {"prompt": gr.Textbox(label="Prompt", lines=4, max_lines=12, elem_id="prompt",
                              placeholder="Ask something, or pick an example below", interactive=engine.can_generate)}
    with gr.Row():
        c["run_btn"] = gr.Button("Run", variant="primary", elem_id="run-btn", min_width=60,
                                 interactive=engine.can_generate)
        c["stop_btn"] = gr.Button("Stop", variant="stop", elem_id="stop-btn", min_width=60)
        c["clear_btn"] = gr.Button("Clear", elem_id="clear-btn", min_width=60)
    c["example"] = gr.Dropdown(EXAMPLE_CHOICES, value=None, label="Example prompts", elem_id="examples",
                               interactive=engine.can_generate)
    c["use_pld"] = gr.Checkbox(label="Third lane: prompt lookup", value=False, elem_id="use-pld")
    c["lookup_branch"] = gr.Checkbox(
        label="DART + lookup branch", value=False, elem_id="lookup-branch",
        info="add prompt lookup's copied continuation to every DART tree (not in the paper); where no drafted tree "
             "pays on this machine, the automatic budget may verify the branch alone")
    with gr.Accordion("Sampling", open=False):
        for knob in SAMPLING_KNOBS:
            c[knob.name] = _slider(knob)
    with gr.Accordion("Tree knobs", open=False):
        c["auto_budget"] = gr.Checkbox(
            label="Automatic node budget", value=True, elem_id="auto-budget",
            info="chosen as the run goes for the most tokens per second on this machine; the node budget below is "
                 "where it starts")
        for knob in TREE_KNOBS:
            c[knob.name] = _slider(knob)
    return c


def trace_files(engine: Engine) -> Components:
    """Download, upload and export the traces; then how to read the tree."""
    with gr.Accordion("Traces: download or replay", open=not engine.can_generate):
        c = {"downloads": gr.File(label="Download the traces (JSON)", file_count="multiple", interactive=False,
                                  elem_id="downloads"),
             "upload": gr.File(label="Upload traces to replay", file_count="multiple", file_types=[".json"],
                               elem_id="upload"),
             "export_btn": gr.Button("Export HTML", size="sm", elem_id="export-btn"),
             "export": gr.File(label="The run as one HTML file (opens offline, to share)", interactive=False,
                               elem_id="export-file")}
    with gr.Accordion("How to read the tree", open=False):
        gr.Markdown(HELP_PATH.read_text(encoding="utf-8"))
    return c


def lanes(cb: Callbacks) -> Components:
    """The legend, a card per lane (prompt lookup's hidden until it runs) and the run's summary."""
    gr.HTML(LEGEND_HTML, elem_id="legend")
    c = {}
    with gr.Row(equal_height=False, elem_id="lanes"):
        for key, name in LANE_OUTPUTS.items():
            c[name] = gr.HTML(cb.lane_card(Session(), key), elem_id=f"lane-{key}", elem_classes="lane-box",
                              js_on_load=TOKEN_CLICK_JS, visible=key != PLD, min_width=260)
    c["summary"] = gr.HTML("", elem_id="summary")
    return c


def step_controls() -> Components:
    """Which lane and step the views below show, and how."""
    c = {}
    with gr.Row(equal_height=False, elem_id="step-controls"):
        c["lane"] = gr.Radio([], label="Lane", scale=2, min_width=200, elem_id="lane-pick")
        c["step"] = gr.Slider(0, 1, value=0, step=1, label="Step", scale=5, elem_id="step-slider")
        with gr.Column(scale=2, min_width=220):
            with gr.Row():
                c["prev_btn"] = gr.Button("◀ Prev", size="sm", min_width=70, elem_id="prev-btn")
                c["next_btn"] = gr.Button("Next ▶", size="sm", min_width=70, elem_id="next-btn")
            c["follow"] = gr.Checkbox(label="Follow the newest step", value=True, elem_id="follow", container=False)
            c["skip_plain"] = gr.Checkbox(label="Skip steps without a tree", value=True, elem_id="skip-plain",
                                          container=False)
            c["show_pruned"] = gr.Checkbox(label="Show pruned candidates", value=False, elem_id="show-pruned",
                                           container=False)
    c["step_info"] = gr.HTML("", elem_id="step-info")
    return c


def tree_tab() -> Components:
    c = {"tree": gr.Plot(figures.message_figure("Run a prompt or upload a trace to see its steps."),
                         show_label=False, elem_id="tree-plot")}
    # Drawn only on a click, for the selected step: streaming stays as fast as before.
    with gr.Accordion("Animate: this step being built, or the whole run", open=False):
        with gr.Row():
            c["anim_speed"] = gr.Dropdown([(f"{x:g}×", x) for x in SPEEDS], value=1.0, label="Speed", min_width=100,
                                          elem_id="anim-speed")
            c["anim_btn"] = gr.Button("Animate step", elem_id="animate-btn")
            c["autoplay_btn"] = gr.Button("Autoplay run", elem_id="autoplay-btn")
        c["animation"] = gr.HTML("", html_template='<div class="anim-plot"></div>', js_on_load=ANIMATION_JS,
                                 elem_id="animation-plot")
    return c


def pruning_tab() -> Components:
    return {"table": gr.Dataframe(headers=list(COLUMNS), label="Best candidates per draft row", interactive=False,
                                  wrap=True, max_height=440, elem_id="prune-table",
                                  column_widths=["6%", "5%", "14%", "12%", "7%", "7%", "7%", "8%", "7%", "7%", "10%",
                                                 "10%"]),
            "heatmap": gr.Plot(label="Draft rows", elem_id="rows-plot")}


def whatif_tab() -> Components:
    gr.Markdown("Change the tree knobs and rerun only the search of the selected DART step: the draft rows are reused "
                "as recorded. With the model loaded the new tree is verified by one target forward; without it, a "
                "greedy trace still tells exactly what would be accepted.")
    c = {}
    with gr.Row():
        for knob in TREE_KNOBS:
            c[f"wi_{knob.name}"] = _slider(knob, "wi-", min_width=160)
    c["wi_btn"] = gr.Button("Rerun the search of this step", elem_id="whatif-btn")
    c["wi_info"] = gr.HTML("", elem_id="whatif-info")
    c["wi_tree"] = gr.Plot(show_label=False, elem_id="whatif-plot")
    return c


def view_tabs() -> Components:
    """The step's tree, its pruning, the run's charts, what-if, and the glossary (with the tour again)."""
    c = {}
    with gr.Tabs():
        with gr.Tab(TREE_TAB):
            c.update(tree_tab())
        with gr.Tab(PRUNING_TAB):
            c.update(pruning_tab())
        with gr.Tab(CHARTS_TAB):
            for name in CHART_OUTPUTS:
                c[name] = gr.Plot(show_label=False, elem_id=name.replace("_", "-"))
        with gr.Tab(WHATIF_TAB):
            c.update(whatif_tab())
        with gr.Tab(GLOSSARY_TAB):
            gr.HTML(glossary_html(), elem_id="glossary")
            c["tour_again"] = gr.Button("Show the tour again", size="sm", elem_id="tour-again")
    return c


def page(engine: Engine, cb: Callbacks) -> Components:
    """The whole page: the header, then the controls beside the lanes and the step views."""
    c = {"state": gr.State(None), **header(engine)}
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=300):
            c.update(run_controls(engine))
            c.update(trace_files(engine))
        with gr.Column(scale=4):
            c.update(lanes(cb))
            c.update(step_controls())
            c.update(view_tabs())
    return c
