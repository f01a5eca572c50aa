"""What the app's parts mean, as HTML: the first-visit tour (the lanes, the tree's colours, the tabs) and the glossary.

The colours are the figures' own and the words dart_core.glossary's, so the explanations cannot drift from the views.
"""

from __future__ import annotations

import html

from dart_core.glossary import GLOSSARY
from dart_core.methods import DART, LANE_ORDER, LANES, PLD, VANILLA
from dart_core.views.figures import (ACCEPTED, BONUS, CATEGORIES, COLORS, MISSED_COLOR, MISSED_NAME, NAMES,
                                     PRUNED_BEAM, PRUNED_BUDGET, PRUNED_MORE, PRUNED_NGRAM, REJECTED, ROOT)


TREE_TAB, PRUNING_TAB, CHARTS_TAB, WHATIF_TAB, GLOSSARY_TAB = (
    "Token tree", "Pruning decisions", "Run charts", "What-if", "Glossary")
TABS = {
    TREE_TAB: "the selected step's draft tree; hover a node for its scores, tick “Show pruned candidates” for what "
              "the search cut",
    PRUNING_TAB: "per depth, the best candidates with their score parts and fates, and the head's rows as a heatmap",
    CHARTS_TAB: "the whole run: accepted tokens per step, acceptance per position, time per phase, what trees cost "
                "on this machine, and why tokens were missed",
    WHATIF_TAB: "rerun the selected step's search with other knobs and see what would have been accepted",
    GLOSSARY_TAB: "τ, node budget, bonus token and the other words, defined",
}
LANE_MEANING = {
    VANILLA: "the target model alone, one token per forward pass: the baseline every speedup is measured against",
    DART: "a small draft head guesses several tokens at once, an n-gram-guided search turns the guesses into a "
          "tree, and the target checks the whole tree in one forward pass; lossless: greedy, the same tokens",
    PLD: "(optional third lane) drafts by copying what followed the same words earlier in the text",
}
NODE_MEANING = {
    ROOT: "the token the previous step ended with",
    ACCEPTED: "drafts the target agreed with: tokens that cost no extra forward",
    REJECTED: "drafted and checked by the target, but not what it wanted",
    BONUS: "the target's own next token, free with the same forward",
    PRUNED_BUDGET: "in the search's pool, but below the node budget",
    PRUNED_BEAM: "cut by the beam width, never extended",
    PRUNED_NGRAM: "pruned only because the n-gram table never saw it there",
    PRUNED_MORE: "several pruned candidates in one node: “+N more (best score)”",
}
SWATCH = "display:inline-block;width:0.9em;height:0.9em;vertical-align:middle;margin-right:4px;border-radius:50%;"


def _swatch(fill: str, ring: str = "#78909c", width: int = 1) -> str:
    return f'<span style="{SWATCH}background:{fill};border:{width}px solid {ring}"></span>'


def _items(pairs) -> str:
    return "<ul>" + "".join(f"<li>{head} {html.escape(text)}</li>" for head, text in pairs) + "</ul>"


def tour_html() -> str:
    """The first-visit panel: what the lanes, the tree's node colours and the tabs mean."""
    lanes = _items((f"<b>{html.escape(LANES[k].title)}</b>:", LANE_MEANING[k]) for k in LANE_ORDER)
    nodes = _items([(f"{_swatch(COLORS[c])}<b>{html.escape(NAMES[c])}</b> ({COLORS[c]}):", NODE_MEANING[c])
                    for c in CATEGORIES]
                   + [(f"{_swatch('transparent', MISSED_COLOR, 3)}<b>{html.escape(MISSED_NAME)}</b> "
                       f"({MISSED_COLOR} ring):", "where the step stopped short; hover it for why")])
    tabs = _items((f"<b>{html.escape(name)}</b>:", text) for name, text in TABS.items())
    return ('<div class="tour"><h3>Welcome to DART Lab</h3>'
            "<p>Run a prompt: the lanes fill side by side, and every step of DART can be opened below them. In the "
            'lanes, <span class="tok tok-draft">highlighted</span> tokens are drafts the target accepted; click any '
            "token to open the step that made it.</p>"
            f"<h4>The lanes</h4>{lanes}<h4>The token tree's colours</h4>{nodes}<h4>The tabs</h4>{tabs}</div>")


def glossary_html() -> str:
    """dart_core's glossary as a definition list."""
    items = "".join(f"<dt><b>{html.escape(term)}</b></dt><dd>{html.escape(text)}</dd>"
                    for term, text in GLOSSARY.items())
    return f'<dl class="glossary">{items}</dl>'
