"""A run to share: one self-contained HTML file from one or more traces (say a DART lane and a plain lane of the same
prompt) that opens offline, with no server: the lanes' text and metrics, the run's charts, why tokens were missed,
and every step's story and tree.

plotly.js is inlined once; the run charts are drawn on load, and each step's tree is embedded as figure JSON and
drawn only when its step is opened, so a run of a hundred steps stays a few MB and opens fast. Pure: traces in, an
HTML string out (the command `report` and the app's export write it).
"""

from __future__ import annotations

import html
import json

import plotly.io as pio
from plotly.offline import get_plotlyjs

from dart_core.errors import DartError
from dart_core.forensics.misses import REASON_TEXT
from dart_core.methods import DART, LANE_ORDER, LANES, VANILLA, lane_of
from dart_core.metrics import Metrics, tokens_per_second
from dart_core.ngram import NGramModel
from dart_core.trace import Trace

from . import figures
from .animation import run_animation
from .story import story_html
from .text_render import LEGEND_HTML, lane_css, lane_html, lane_text_html, token_text

CONFIG = {"displaylogo": False, "responsive": True}
# Opening a step (or a run's autoplay) draws its figure from the JSON beside it, once, frames and all (an animation
# then plays); every figure shares the one template below.
SCRIPT = """
const TEMPLATE = JSON.parse(document.getElementById('plotly-template').textContent);
document.addEventListener('toggle', (e) => {
  const step = e.target;
  if (!step.open || !step.dataset.tree || step.dataset.drawn) return;
  step.dataset.drawn = '1';
  const fig = JSON.parse(document.getElementById(step.dataset.tree).textContent);
  fig.layout.template = TEMPLATE;
  const div = step.querySelector('.tree'), play = fig.layout.updatemenus?.[0]?.buttons?.[0]?.args;
  Plotly.newPlot(div, {data: fig.data, layout: fig.layout, frames: fig.frames || [], config: CONFIG})
    .then(() => play && Plotly.animate(div, ...play));   // an animation starts playing as it opens
}, true);  // toggle does not bubble: listen while it is captured
"""
CSS = """
body { font-family: system-ui, sans-serif; margin: 16px auto; max-width: 1400px; color: #263238; padding: 0 12px; }
h1 { margin-bottom: 2px; } h2 { margin-top: 28px; border-bottom: 1px solid #cfd8dc; }
.meta { color: #546e7a; font-size: 0.9em; }
.lanes { display: flex; gap: 12px; flex-wrap: wrap; } .lanes > .lane { flex: 1 1 300px; }
.lane { border: 1px solid #cfd8dc; border-radius: 8px; padding: 8px 10px; }
.lane-head { display: flex; justify-content: space-between; } .lane-title { font-weight: 700; }
.lane-status { font-size: 0.8em; color: #546e7a; }
.lane-stats { display: flex; flex-wrap: wrap; gap: 4px 12px; margin: 4px 0 6px; font-size: 0.85em; }
.stat-label { color: #78909c; } .stat-value { font-weight: 600; }
.lane-text { white-space: pre-wrap; word-break: break-word; font-family: ui-monospace, monospace; font-size: 0.86em;
             line-height: 1.5; margin: 0; max-height: 360px; overflow-y: auto; background: #fafafa; padding: 6px; }
.tok-draft { background: #c8e6c9; } .tok-special { color: #90a4ae; }
.legend { font-size: 0.85em; color: #546e7a; } .legend-note { display: none; }
table { border-collapse: collapse; font-size: 0.9em; } td, th { border: 1px solid #cfd8dc; padding: 2px 8px; }
details.step { border-bottom: 1px solid #eceff1; padding: 2px 0; } details.step > summary { cursor: pointer; }
.miss { color: #bf360c; } .emitted { white-space: pre-wrap; background: #eceff1; padding: 0 4px; }
.step-story { margin: 4px 0 8px 1.2em; font-size: 0.92em; color: #37474f; }
"""


class ReportError(DartError):
    """Traces that do not make one report (none, or two of one lane)."""


def report_html(traces: list[Trace], title: str | None = None, ngram: NGramModel | None = None) -> str:
    """The whole report of `traces` (one per lane), as one HTML document; the title defaults to the prompt.
    `ngram`: the DART run's n-gram table, to replay its search for the forensics (n-gram weight, beam width)."""
    lanes: dict[str, Trace] = {}
    for trace in traces:
        key = lane_of(trace.method)
        if key in lanes:
            raise ReportError(f"two traces for the {LANES[key].short} lane: a report holds one per lane")
        lanes[key] = trace
    if not lanes:
        raise ReportError("no trace to report")
    lanes = {k: lanes[k] for k in LANE_ORDER if k in lanes}
    first = next(iter(lanes.values()))
    title = title or f"DART Lab run: {_short(first.prompt_text)}"
    template = json.loads(pio.json.to_json_plotly(pio.templates[pio.templates.default].to_plotly_json()))
    body = [f"<h1>{html.escape(title)}</h1>", _meta(first),
            "<h2>The lanes</h2>", LEGEND_HTML, '<div class="lanes">',
            *(_lane_card(k, t, lanes.get(VANILLA)) for k, t in lanes.items()), "</div>",
            "<h2>The run</h2>", _charts(lanes)]
    if DART in lanes:
        body += ["<h2>Why tokens were missed</h2>", _forensics(lanes[DART], ngram)]
    for key, trace in lanes.items():
        body += [f"<h2>Steps: {html.escape(_lane_title(key, trace))}</h2>",
                 *([_autoplay(key, trace)] if key != VANILLA else []),   # plain decoding drafts nothing to play
                 '<p class="meta">Open a step for its story and its token tree.</p>', _steps(key, trace)]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{CSS}{lane_css()}</style>"
            f"<script>{get_plotlyjs()}</script><script>const CONFIG = {json.dumps(CONFIG)};</script></head><body>"
            + "\n".join(body)
            + f'<script type="application/json" id="plotly-template">{_json(template)}</script>'
            f"<script>{SCRIPT}</script></body></html>\n")


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _json(obj) -> str:
    """JSON safe inside a <script>: `<` only ever occurs in strings, where \\u003c means the same."""
    return json.dumps(obj, separators=(",", ":")).replace("<", "\\u003c")


def _figure(fig) -> str:
    return fig.to_html(include_plotlyjs=False, full_html=False, config=CONFIG)


def _lane_title(key: str, trace: Trace) -> str:
    name = LANES[key].short
    return name if trace.method == key else f"{name} ({trace.method})"


def _meta(trace: Trace) -> str:
    return (f'<p class="meta">{html.escape(trace.settings.text())}</p>'
            f'<p><b>Prompt</b></p><pre class="lane-text">{html.escape(trace.prompt_text)}</pre>')


def _lane_seconds(trace: Trace) -> float:
    """The lane's own seconds: what the app recorded, else the sum of its step timings (as the app's replay)."""
    own = trace.settings.lane_seconds
    return own if own and own > 0 else sum(sum(s.timings.values()) for s in trace.steps)


def _lane_card(key: str, trace: Trace, plain: Trace | None) -> str:
    m = Metrics.from_steps(trace.steps)
    seconds = _lane_seconds(trace)
    rate = tokens_per_second(m.new_tokens, seconds)
    stats = [("tokens", str(m.new_tokens)), ("tok/s", f"{rate:.1f}"), ("steps", str(len(trace.steps))),
             ("tokens per forward", f"{m.tokens_per_forward:.2f}"), ("time", f"{seconds:.2f} s")]
    if key != VANILLA:
        stats.insert(2, ("τ", f"{m.tau:.2f}" if m.verify_steps else "–"))
        plain_rate = tokens_per_second(Metrics.from_steps(plain.steps).new_tokens, _lane_seconds(plain)) \
            if plain is not None else 0.0
        if plain_rate > 0 and rate > 0:
            stats.insert(3, ("speedup", f"{rate / plain_rate:.2f}×"))
    stop = trace.steps[-1].stop_reason or "–"
    body = lane_text_html(trace, key, frozenset(trace.settings.stop_ids))
    return lane_html(key, _lane_title(key, trace), f"stopped: {stop}", stats, body)


def _charts(lanes: dict[str, Trace]) -> str:
    charts = [figures.accepted_length_figure(lanes), figures.acceptance_by_position_figure(lanes),
              *(figures.time_split_figure(t, k) for k, t in lanes.items())]
    machine = lanes[DART].settings.machine if DART in lanes else None
    if machine is not None and machine.cost_curve is not None:   # only automatic budgets measure it
        charts.append(figures.cost_figure(lanes[DART]))
    return "\n".join(_figure(f) for f in charts)


def _forensics(trace: Trace, ngram: NGramModel | None) -> str:
    """The misses chart, then the same numbers as tables: steps per reason, and what each knob would add."""
    found = figures.forensics_of(trace, ngram)
    parts = [_figure(figures.misses_figure(trace, found=found))]
    counts = found.counts
    if counts:
        rows = "".join(f"<tr><td>{html.escape(REASON_TEXT[r])}</td><td>{n}</td></tr>" for r, n in counts.items())
        parts.append(f'<table class="miss-reasons"><tr><th>why the wanted token was not accepted</th><th>steps</th>'
                     f"</tr>{rows}</table>")
    effects = found.budgets + found.knobs
    if effects:
        rows = "".join(f"<tr><td>{html.escape(e.label)}</td><td>{e.extra_tokens:+d}</td><td>{e.extra_nodes:+.1f}</td>"
                       f"</tr>" for e in effects)
        notes = "".join(f"<p class=\"note\">{html.escape(n)}</p>" for n in found.notes)
        parts.append(f'<p>What each knob would have recovered over this run (alone, everything else as the run had '
                     f'it):</p><table class="knob-effects"><tr><th>setting</th><th>accepted tokens</th>'
                     f"<th>nodes per forward</th></tr>{rows}</table>{notes}")
    return "\n".join(parts)


def _embedded(fig, fig_id: str) -> str:
    """A figure drawn when its <details> opens: a place for it and its JSON (see SCRIPT)."""
    data = json.loads(fig.to_json())
    data["layout"].pop("template", None)    # one shared copy (TEMPLATE in the script)
    return f'<div class="tree"></div><script type="application/json" id="{fig_id}">{_json(data)}</script>'


def _autoplay(key: str, trace: Trace) -> str:
    """The run played step by step, each frame a step's tree with its accepted path (dart_core.views.animation)."""
    fig_id = f"autoplay-{key}"
    return (f'<details class="autoplay" data-tree="{fig_id}"><summary>Autoplay: the run step by step</summary>'
            f"{_embedded(run_animation(trace), fig_id)}</details>")


def _steps(key: str, trace: Trace) -> str:
    """One <details> per step: a summary line, the story, and (for a step with a draft tree) the tree's JSON."""
    out = []
    for i, step in enumerate(trace.steps):
        emitted = "".join(token_text(trace, t) for t in step.new_tokens).replace("\n", "↵")   # one line each
        line = f"step {i}: " + ("prefill" if step.kind == "prefill" else
                                f"{len(step.tree) - 1 if step.tree else 0} draft nodes, {step.accepted} accepted")
        line = (f"{html.escape(line)} · emitted <code class=\"emitted\">{html.escape(emitted)}</code>")
        if (miss := figures.step_miss_of(trace, i)) is not None:
            line += ' · <span class="miss">missed: ' + html.escape(miss.text(lambda t: token_text(trace, t))) + "</span>"
        # Plain decoding's trees are a root and one token: only steps that drafted (and every DART step) get one.
        has_tree = step.tree is not None and (trace.uses_tree_search or len(step.tree) > 1)
        tree_id = f"tree-{key}-{i}"
        tree = _embedded(figures.tree_figure(trace, i), tree_id) if has_tree else ""
        attr = f' data-tree="{tree_id}"' if has_tree else ""
        out.append(f'<details class="step" id="step-{key}-{i}"{attr}><summary>{line}</summary>'
                   f"{story_html(trace, i)}{tree}</details>")
    return "\n".join(out)
