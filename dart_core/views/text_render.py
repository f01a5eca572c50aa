"""Token text as HTML: each emitted token marked by origin (verified draft vs the target's own token), escaped.

Everything that came from a model or a user goes through `html.escape`; whitespace is kept by the `<pre>` the
text sits in, so code keeps its indentation and line breaks.
"""

from __future__ import annotations

import html

from dart_core.methods import LANES
from dart_core.trace import StepRecord, Trace

DRAFT, TARGET = "draft", "target"   # a verified draft token / a token the target chose itself (prefill, bonus)
ORIGIN_TITLES = {DRAFT: "verified draft token", TARGET: "target's own token"}


def token_origins(step: StepRecord) -> list[str]:
    """Origin of each of the step's emitted tokens: the first `accepted` are drafts, the rest the target's own."""
    if step.kind != "verify":
        return [TARGET] * len(step.new_tokens)
    return [DRAFT if i < step.accepted else TARGET for i in range(len(step.new_tokens))]


def token_text(trace: Trace, token: int) -> str:
    text = trace.token_text.get(int(token))
    return text if text is not None else f"<{int(token)}>"


def plotly_escape(text: str) -> str:
    """Escape text for plotly's labels and hover: it parses a few tags and decodes only &amp; &lt; &gt; (and
    numeric entities), so quotes stay as they are."""
    return html.escape(text, quote=False)


def token_label(text: str, limit: int = 14) -> str:
    """A short, visible, escaped form of a token for figure labels (spaces and newlines made visible)."""
    shown = text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥").replace("\r", "␍") or "∅"
    if len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return plotly_escape(shown)


def lane_text_html(trace: Trace, lane: str, special_ids=frozenset()) -> str:
    """The lane's output as `<pre>` HTML: one span per token, with its step and origin for clicks and styling."""
    parts = []
    for step in trace.steps:
        for tok, origin in zip(step.new_tokens, token_origins(step)):
            classes = f"tok tok-{origin}" + (" tok-special" if tok in special_ids else "")
            title = f"step {step.index} · {ORIGIN_TITLES[origin]} · id {tok}"
            parts.append(f'<span class="{classes}" data-lane="{html.escape(lane)}" data-step="{step.index}" '
                         f'title="{html.escape(title)}">{html.escape(token_text(trace, tok))}</span>')
    return f'<pre class="lane-text">{"".join(parts)}</pre>'


def lane_html(lane: str, title: str, status: str, stats: list[tuple[str, str]], body: str) -> str:
    """A lane card: title and status, a row of stats, then the body HTML (already escaped)."""
    items = "".join(f'<span class="stat"><span class="stat-label">{html.escape(k)}</span> '
                    f'<span class="stat-value">{html.escape(v)}</span></span>' for k, v in stats)
    return (f'<div class="lane lane-{html.escape(lane)}" data-status="{html.escape(status)}">'
            f'<div class="lane-head"><span class="lane-title">{html.escape(title)}</span>'
            f'<span class="lane-status status-{html.escape(status.split(" ")[0])}">{html.escape(status)}</span></div>'
            f'<div class="lane-stats">{items}</div>{body}</div>')


def lane_css() -> str:
    """The lane cards' colour rules (the `lane-<key>` class of lane_html), made from the one lane table so that the
    app's page and the HTML report colour a lane as its charts do."""
    return "\n".join(f".lane-{key} {{ border-top: 4px solid {look.colour}; }}" for key, look in LANES.items())


LEGEND_HTML = ('<div class="legend"><span class="tok tok-draft">verified draft token</span> '
               '<span class="tok tok-target">target\'s own token (prefill / bonus)</span> '
               '<span class="legend-note">click a token to open its step</span></div>')
