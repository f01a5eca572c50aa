"""The views that explain a step: the grouped pruned view, the missed token marked, the glossary and the tour."""

from __future__ import annotations

import html
import re
from collections import Counter
from html.parser import HTMLParser

import gradio as gr
import numpy as np
import pytest

from app.engine import Engine
from app.explain import TABS, glossary_html, tour_html
from app.ui import build_app
from dart_core import metrics
from dart_core.decoding import GenerationConfig, run
from dart_core.forensics.misses import BEAM, BUDGET, NGRAM, NOT_IN_TOPK, REASON_TEXT, run_misses
from dart_core.glossary import GLOSSARY
from dart_core.methods import LANE_ORDER, LANES
from dart_core.ngram import NGramModel
from dart_core.proposers import DartProposer
from dart_core.trace import RunSettings
from dart_core.tree_search import KEPT, NODE_BUDGET, Candidates, SearchConfig
from dart_core.views import figures
from dart_core.views.figures import BONUS, NAMES, PRUNED, PRUNED_MORE, ROW_PX
from dart_core.views.pruned_groups import ROOT, pruned_groups
from tests.app_fixtures import tiny_traces
from dart_core.setup.tiny_models import NoisyDrafter, tiny_target


def hand_candidates(rows) -> Candidates:
    """Candidates from (parent, level, score, node) rows; a node > 0 is kept."""
    parent, level, score, node = (np.asarray(col) for col in zip(*rows))
    n = len(rows)
    return Candidates(
        token=np.arange(100, 100 + n), level=level.astype(np.int32), parent=parent.astype(np.int32),
        draft_prob=np.full(n, 0.1), logit_term=np.zeros(n), ngram_prob=np.full(n, np.nan),
        ngram_match=np.full(n, -1, dtype=np.int8), ngram_term=np.zeros(n), level_weight=np.ones(n),
        score=score.astype(np.float64), fate=np.asarray([KEPT if k > 0 else NODE_BUDGET for k in node], dtype=object),
        beam=np.asarray(["expanded"] * n, dtype=object), node=np.where(node > 0, node, -1).astype(np.int32))


# Two kept first-level nodes (0, 1) and ten pruned candidates: five more under the root, four under kept node 0,
# one under pruned 5, one under pruned 7, one under kept node 1.
HAND = [(-1, 0, -0.1, 1), (-1, 0, -0.2, 2),
        (-1, 0, -1.0, 0), (-1, 0, -2.0, 0), (-1, 0, -3.0, 0), (-1, 0, -4.0, 0), (-1, 0, -5.0, 0),
        (0, 1, -1.5, 0), (0, 1, -2.5, 0), (0, 1, -3.5, 0), (0, 1, -6.0, 0),
        (5, 1, -4.5, 0), (7, 2, -2.0, 0), (1, 1, -7.0, 0)]


def groups_of(g, c):
    return {(m.depth, m.parent): (m.members, m.best(c)) for m in g.more}


def test_grouping_per_parent_with_room_for_all():
    c = hand_candidates(HAND)
    g = pruned_groups(c, per_parent=3, max_shown=100)
    assert g.total == 12
    assert g.shown == [2, 7, 3, 12, 8, 4, 9, 13]          # best first, at most 3 under the root and under node 0
    assert groups_of(g, c) == {(1, ROOT): ([5, 6], -4.0),   # the root's other two: "+2 more (best -4)"
                               (2, 0): ([10], -6.0),        # kept node 0's fourth pruned child
                               (2, None): ([11], -4.5)}     # under pruned 5, which is not drawn: its depth's rest


def test_grouping_under_a_cap_collapses_to_the_depths():
    c = hand_candidates(HAND)
    g = pruned_groups(c, per_parent=3, max_shown=4)
    assert g.shown == [2, 7, 3, 12]
    assert groups_of(g, c) == {(1, ROOT): ([4, 5, 6], -3.0), (2, 0): ([8, 9, 10], -2.5),
                               (2, None): ([11, 13], -4.5)}   # kept node 1 has none drawn: its child joins the depth
    counted = g.shown + [i for m in g.more for i in m.members]
    assert sorted(counted) == list(range(2, 14))             # every pruned candidate exactly once
    assert pruned_groups(c, per_parent=1, max_shown=100).shown == [2, 7, 12, 13]




def node_positions(fig) -> dict[str, tuple[float, float, str, str]]:
    """key -> (x, y, label, legend name) of every drawn node."""
    return {key: (x, y, label, t.name) for t in fig.data if t.mode == "markers+text"
            for key, x, y, label in zip(t.customdata, t.x, t.y, t.text)}


def test_the_pruned_view_of_a_full_pool_is_grouped_and_counts_everything(big):
    c = big.steps[1].candidates
    fig = figures.tree_figure(big, 1, show_pruned=True)
    nodes = node_positions(fig)
    drawn = [k for k, v in nodes.items() if v[3] in {NAMES[p] for p in PRUNED}]
    more = {k: v for k, v in nodes.items() if v[3] == NAMES[PRUNED_MORE]}
    assert len(drawn) == figures.MAX_PRUNED
    counted = [int(re.match(r"\+(\d+) more \(best -?\d+\.\d\d\)$", v[2]).group(1)) for v in more.values()]
    assert len(drawn) + sum(counted) == int((c.node < 0).sum()) > 1500
    assert len(nodes) < len(big.steps[1].tree) + 2 * figures.MAX_PRUNED      # not thousands of labels
    assert max(Counter(int(c.parent[int(k[1:])]) for k in drawn).values()) <= 3   # at most 3 under a parent


@pytest.mark.parametrize("show_pruned", [True, False])
def test_no_two_labels_in_a_column_are_closer_than_a_row(big, show_pruned):
    fig = figures.tree_figure(big, 1, show_pruned=show_pruned)
    layout = fig.layout
    px_per_unit = (layout.height - layout.margin.t - layout.margin.b) / (layout.yaxis.range[1] - layout.yaxis.range[0])
    columns: dict[float, list[float]] = {}
    for x, y, _, _ in node_positions(fig).values():
        columns.setdefault(x, []).append(y)
    assert len(columns) >= 4
    for ys in columns.values():
        gaps = np.diff(sorted(ys)) * px_per_unit
        assert not len(gaps) or gaps.min() >= ROW_PX - 1e-6


def test_a_depth_with_nothing_drawn_shows_only_its_summary(big):
    fig = figures.tree_figure(big, 1, show_pruned=True, max_pruned=5)
    nodes = node_positions(fig)
    pruned_depths = {x for x, _, _, name in nodes.values() if name in {NAMES[p] for p in PRUNED}}
    collapsed = [x for x in range(1, 6) if x not in pruned_depths]
    assert collapsed
    for x in collapsed:
        summaries = [k for k, v in nodes.items() if v[3] == NAMES[PRUNED_MORE] and v[0] == x]
        assert summaries == [f"m{x}"]                          # one node for the whole depth, under no parent
    assert "showing the 5 best-scored of" in fig.layout.title.text


# ---------------------------------------------------------------------------------------------- the missed token
@pytest.fixture(scope="module")
def missing():
    """A greedy DART run of a blurred drafter (as tests/test_forensics.py builds it): it stops short often."""
    search = SearchConfig(topk=8, beam_width=4, node_budget=4)
    target = tiny_target("llama", seed=9)
    rng = np.random.default_rng(0)
    table = NGramModel.build([rng.integers(3, 96, 400).tolist()], vocab_size=target.vocab_size, order=3)
    trace = run(target, DartProposer(NoisyDrafter(target), search, table), [1, 4, 5, 6, 7, 8],
                GenerationConfig(max_new_tokens=40), settings=RunSettings(search=search))
    trace.token_text = {t: f" w{t}" for t in trace.mentioned_tokens()}
    return trace


def first_miss(trace, reasons):
    return next(m for m in run_misses(trace) if m.reason in reasons)


def rings(fig) -> dict[str, str]:
    return {k: h for t in fig.data if t.name == figures.MISSED_NAME for k, h in zip(t.customdata, t.hovertext)}


def missed_shapes(fig):
    return [s for s in fig.layout.shapes if s.line.color == figures.MISSED_COLOR]


def test_a_miss_in_the_rows_is_ringed_in_the_tree_and_outlined_in_the_rows(missing):
    m = first_miss(missing, (BUDGET, NGRAM, BEAM))
    tree = figures.tree_figure(missing, m.step)
    assert list(rings(tree)) == ["bonus"]                       # where the wanted token would have hung
    hover = rings(tree)["bonus"]
    assert f"wanted “ w{m.token}” at depth {m.depth}" in hover and REASON_TEXT[m.reason] in hover
    bonus = next(t for t in tree.data if t.name == NAMES[BONUS])
    ring = next(t for t in tree.data if t.name == figures.MISSED_NAME)
    assert (ring.x[0], ring.y[0]) == (bonus.x[0], bonus.y[0])
    assert "ringed: the target wanted" in tree.layout.title.text
    heat = figures.rows_heatmap(missing, m.step)
    (shape,) = missed_shapes(heat)
    assert (shape.x0 + 0.5, shape.y0 + 0.5) == (m.row_rank, m.depth - 1)   # the wanted token's cell
    assert np.asarray(heat.data[0].z).shape[1] > m.row_rank
    assert "missed" in np.asarray(heat.data[0].hovertext)[m.depth - 1][m.row_rank]
    assert "outlined" in heat.layout.title.text and "not in the top-k" not in heat.layout.title.text


def test_a_pruned_miss_is_ringed_where_the_pruned_view_draws_it(missing):
    m = first_miss(missing, (BUDGET, NGRAM))
    c = missing.steps[m.step].candidates
    fig = figures.tree_figure(missing, m.step, show_pruned=True)
    drawn = [k for k in rings(fig) if k.startswith("c")]
    assert len(drawn) == 1 and int(c.token[int(drawn[0][1:])]) == m.token    # the pool's candidate itself
    assert int(c.level[int(drawn[0][1:])]) + 1 == m.depth


def test_a_miss_outside_the_top_k_is_named_in_the_rows_title(missing):
    m = first_miss(missing, (NOT_IN_TOPK,))
    heat = figures.rows_heatmap(missing, m.step)
    assert not missed_shapes(heat)
    assert f"“␣w{m.token}” at depth {m.depth}: not in the top-k" in heat.layout.title.text
    assert "bonus" in rings(figures.tree_figure(missing, m.step))


def test_no_mark_where_nothing_was_missed():
    dart = tiny_traces()["dart"]   # an oracle drafter: some steps accept every row
    full = [i for i, s in enumerate(dart.steps) if s.rows_tokens is not None and s.accepted == s.rows_tokens.shape[0]]
    assert full
    for i in full + [0]:
        assert not rings(figures.tree_figure(dart, i, show_pruned=True))
        heat = figures.rows_heatmap(dart, i)
        assert not missed_shapes(heat) and "wanted" not in (heat.layout.title.text or "")


# ---------------------------------------------------------------------------------------------- glossary and tour
TERMS = ("τ (tau)", "acceptance per position", "tokens per forward", "node budget", "beam (width)", "n-gram term",
         "lookup branch", "bonus token", "draft head row", "speedup")


class Definitions(HTMLParser):
    """{term: definition} of a <dl>, the text unescaped."""

    def __init__(self, markup: str):
        super().__init__()
        self.items: dict[str, str] = {}
        self.tag, self.term = None, None
        self.feed(markup)

    def handle_starttag(self, tag, attrs):
        if tag in ("dt", "dd"):
            self.tag = tag

    def handle_data(self, data):
        if self.tag == "dt":
            self.term = data
        elif self.tag == "dd":
            self.items[self.term] = self.items.get(self.term, "") + data


def test_the_glossary_renders_dart_cores_definitions():
    assert set(TERMS) <= set(GLOSSARY)
    assert Definitions(glossary_html()).items == GLOSSARY
    refs = set(re.findall(r'GLOSSARY\["([^"]+)"\]', metrics.__doc__))   # the metrics name their definitions
    assert {"τ (tau)", "tokens per forward", "acceptance per position"} <= refs <= set(GLOSSARY)


def test_the_tour_names_the_real_colours_lanes_and_tabs():
    tour = tour_html()
    for cat in figures.CATEGORIES:
        assert f"background:{figures.COLORS[cat]}" in tour and html.escape(NAMES[cat]) in tour
    assert f"solid {figures.MISSED_COLOR}" in tour and figures.MISSED_NAME in tour
    assert all(LANES[k].title in tour for k in LANE_ORDER)
    assert all(f"<b>{html.escape(name)}</b>" in tour for name in TABS)


def test_the_app_shows_the_tour_until_dismissed_and_the_glossary_tab(tmp_path):
    demo = build_app(Engine.replay_only(None), trace_dir=tmp_path)
    blocks = list(demo.blocks.values())
    assert [b.label for b in blocks if isinstance(b, gr.Tab)] == list(TABS)          # the tour's tabs are the app's
    assert glossary_html() in [b.value for b in blocks if isinstance(b, gr.HTML)]
    tour = next(b for b in blocks if getattr(b, "elem_id", None) == "tour")
    (seen,) = [b for b in blocks if isinstance(b, gr.BrowserState)]
    assert not tour.visible and seen.default_value is False                            # decided at page load
    on_load = next(f for f in demo.fns.values() if f.inputs == [seen] and f.outputs == [tour])
    assert on_load.fn(False)["visible"] is True and on_load.fn(True)["visible"] is False
    ok = next(f for f in demo.fns.values() if f.outputs == [seen, tour])
    assert ok.fn() == (True, gr.update(visible=False))                                 # remembered in the browser
