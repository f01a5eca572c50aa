"""Figure, table and text builders of the app, from synthetic traces (no browser, no tokenizer)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dart_core.methods import LANES
from dart_core.metrics import Metrics
from dart_core.trace import StepRecord
from dart_core.views import figures
from dart_core.views.figures import ACCEPTED, BONUS, COLORS, NAMES, PRUNED, REJECTED, ROOT
from dart_core.views.pruning import COLUMNS, fate_counts, pruning_table
from dart_core.views.text_render import DRAFT, TARGET, lane_text_html, token_label, token_origins
from tests.app_fixtures import hand_trace






def node_traces(fig):
    """{category name: scatter trace} for the node (marker) traces of a tree figure."""
    return {t.name: t for t in fig.data if t.mode == "markers+text"}


# ---------------------------------------------------------------------------------------------- tree figure
def test_tree_nodes_one_per_token_plus_bonus(hand):
    step = hand.steps[1]
    fig = figures.tree_figure(hand, 1)
    nodes = node_traces(fig)
    assert sum(len(t.x) for t in nodes.values()) == len(step.tree) + 1   # every tree node, and the bonus
    assert len(nodes[NAMES[ROOT]].x) == 1
    assert len(nodes[NAMES[ACCEPTED]].x) == step.accepted == 2
    assert len(nodes[NAMES[REJECTED]].x) == len(step.tree) - 1 - step.accepted
    assert len(nodes[NAMES[BONUS]].x) == 1
    assert not any(NAMES[c] in nodes for c in PRUNED)                    # pruned ones only on the toggle


def test_accepted_path_colour_and_nodes(hand):
    step = hand.steps[1]
    nodes = node_traces(figures.tree_figure(hand, 1))
    acc = nodes[NAMES[ACCEPTED]]
    assert acc.marker.color == COLORS[ACCEPTED]
    assert sorted(acc.customdata) == sorted(f"n{n}" for n in step.path[1:])
    assert nodes[NAMES[REJECTED]].marker.color == COLORS[REJECTED]
    assert len({COLORS[c] for c in figures.CATEGORIES}) == len(figures.CATEGORIES)   # one colour per fate
    # The accepted path is drawn as one thick edge chain: root -> node 1 -> node 3.
    edges = next(t for t in fig_edges(hand) if t.name == "edges: accepted")
    assert edges.line.color == COLORS[ACCEPTED] and len(edges.x) == 3 * step.accepted


def fig_edges(trace):
    return [t for t in figures.tree_figure(trace, 1).data if t.mode == "lines"]


def test_layout_depth_is_x_and_children_right_of_parents(hand):
    step = hand.steps[1]
    fig = figures.tree_figure(hand, 1)
    pos = {}
    for t in node_traces(fig).values():
        for key, x, y in zip(t.customdata, t.x, t.y):
            pos[key] = (x, y)
    for n in range(len(step.tree)):
        assert pos[f"n{n}"][0] == step.tree.depths[n]
    assert pos["bonus"][0] == step.tree.depths[step.path[-1]] + 1
    assert len(set(pos.values())) == len(pos)   # no two nodes on top of each other


def test_hover_text_has_scores_and_fate(hand):
    nodes = node_traces(figures.tree_figure(hand, 1))
    acc_hover = nodes[NAMES[ACCEPTED]].hovertext
    deep = next(h for h in acc_hover if "depth 2" in h)      # the accepted depth-2 node has an n-gram term
    for part in ("draft prob: 0.6000", "n-gram prob:", "matched context (2 tokens)", "level weight:",
                 "cumulative score:", "fate: accepted"):
        assert part in deep, part
    shallow = next(h for h in acc_hover if "depth 1" in h)   # level 0 is scored by the draft alone
    assert "n-gram: not used at this level" in shallow
    assert all("fate: verified, rejected" in h for h in nodes[NAMES[REJECTED]].hovertext)
    assert "bonus" in nodes[NAMES[BONUS]].hovertext[0] or "target's own" in nodes[NAMES[BONUS]].hovertext[0]


def test_token_text_is_escaped_in_labels_and_hover(hand):
    fig = figures.tree_figure(hand, 1, show_pruned=True)
    texts = [s for t in node_traces(fig).values() for s in list(t.text) + list(t.hovertext)]
    bold = [s for s in texts if "bold" in s]
    assert bold, "token 8 ('<b>bold</b>') is a candidate of depth 1"
    assert all("<b>bold" not in s and "&lt;b&gt;bold" in s for s in bold)
    assert token_label('<x y="1">&\n') == '&lt;x␣y="1"&gt;&amp;↵'   # plotly decodes only &amp; &lt; &gt;


def test_pruned_toggle_adds_pruned_candidates_with_their_own_colours(hand):
    step = hand.steps[1]
    fig = figures.tree_figure(hand, 1, show_pruned=True)
    nodes = node_traces(fig)
    pruned = [t for name, t in nodes.items() if name in {NAMES[c] for c in PRUNED}]
    n_pruned = sum(len(t.x) for t in pruned)
    assert n_pruned == int((step.candidates.node < 0).sum())     # all of them fit under the cap here
    for cat in PRUNED:
        if NAMES[cat] in nodes:
            assert nodes[NAMES[cat]].marker.color == COLORS[cat]
    assert NAMES[figures.PRUNED_NGRAM] in nodes                   # the hand trace has unseen-n-gram pruning
    assert all("unseen n-gram" in h for h in nodes[NAMES[figures.PRUNED_NGRAM]].hovertext)
    capped = figures.tree_figure(hand, 1, show_pruned=True, max_pruned=2)
    assert sum(len(t.x) for name, t in node_traces(capped).items() if name in {NAMES[c] for c in PRUNED}) == 2
    assert "showing the 2 best-scored of" in capped.layout.title.text


def test_prefill_and_bad_index_give_a_message_not_a_tree(hand):
    for index in (0, 99, -1):
        fig = figures.tree_figure(hand, index)
        assert not node_traces(fig)
        assert fig.layout.annotations
    assert "prefill" in figures.tree_figure(hand, 0).layout.annotations[0].text


def test_real_run_trees(tiny):
    dart = tiny["dart"]
    for i, step in enumerate(dart.steps[1:], start=1):
        nodes = node_traces(figures.tree_figure(dart, i))
        assert sum(len(t.x) for t in nodes.values()) == len(step.tree) + (len(step.new_tokens) == step.accepted + 1)
        assert len(nodes.get(NAMES[ACCEPTED], ()).x if NAMES[ACCEPTED] in nodes else ()) == step.accepted
    pld = tiny["pld"]   # prompt lookup: chain trees without candidates still draw
    step = next(i for i, s in enumerate(pld.steps) if s.tree is not None and len(s.tree) > 1)
    nodes = node_traces(figures.tree_figure(pld, step, show_pruned=True))
    assert sum(len(t.x) for t in nodes.values()) >= len(pld.steps[step].tree)


# ---------------------------------------------------------------------------------------------- rows and table
def test_rows_heatmap_marks_accepted_tokens(hand):
    step = hand.steps[1]
    fig = figures.rows_heatmap(hand, 1)
    heat = fig.data[0]
    assert np.asarray(heat.z).shape == step.rows_probs.shape
    text = np.asarray(heat.text)
    assert text[0][0].endswith("✓") and text[1][0].endswith("✓")    # 21 then 23: the accepted path
    assert "&lt;b&gt;" in text[0][1]                                   # escaped token 8
    assert not figures.rows_heatmap(hand, 0).data                      # prefill: message only


def test_pruning_table_per_row_fates(hand):
    step = hand.steps[1]
    df = pruning_table(hand, 1, per_row=2)
    assert list(df.columns) == list(COLUMNS)
    assert sorted(df["depth"].unique().tolist()) == [1, 2, 3]
    assert df.groupby("depth").size().max() <= 2
    assert set(df["fate"]) <= {"kept", "beam cut", "node budget", "unseen n-gram"}
    full = pruning_table(hand, 1, per_row=100)
    assert len(full) == len(step.candidates)
    assert (full["fate"] == "kept").sum() == len(step.tree) - 1
    assert (full["fate"] == "unseen n-gram").sum() == int((step.candidates.fate == "low_ngram").sum())
    assert full.loc[full["token"] == "<b>bold</b>", "after"].iloc[0] == "(root)"   # plain text: the table escapes
    counts = fate_counts(hand, 1)
    assert sum(counts.values()) == len(step.candidates) and counts["kept"] == len(step.tree) - 1
    assert pruning_table(hand, 0).empty


# ---------------------------------------------------------------------------------------------- run charts
def test_accepted_length_chart(tiny):
    fig = figures.accepted_length_figure(tiny)
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {"DART", "prompt lookup"}        # plain decoding never drafts
    dart_steps = [s for s in tiny["dart"].steps if s.kind == "verify"]
    assert list(by_name["DART"].y) == [s.accepted for s in dart_steps]
    assert by_name["DART"].marker.color == LANES["dart"].colour


def test_acceptance_by_position_chart(tiny):
    fig = figures.acceptance_by_position_figure(tiny)
    bars = next(t for t in fig.data if t.name == "DART: reached depth")
    assert list(bars.y) == pytest.approx(Metrics.from_steps(tiny["dart"].steps).acceptance_by_depth)
    assert figures.acceptance_by_position_figure({"vanilla": tiny["vanilla"]}).layout.annotations


def test_time_split_chart_stacks_the_step_timings(hand):
    fig = figures.time_split_figure(hand, "dart")
    assert fig.layout.barmode == "stack"
    totals = np.sum([np.asarray(t.y) for t in fig.data], axis=0)
    assert totals == pytest.approx([sum(s.timings.values()) * 1000 for s in hand.steps])
    assert {t.name for t in fig.data} == {"prefill", "draft", "search", "verify", "accept"}


# ---------------------------------------------------------------------------------------------- lane text
def test_token_origins():
    step = StepRecord(index=3, kind="verify", context_len=9, new_tokens=[4, 5, 6], accepted=2)
    assert token_origins(step) == [DRAFT, DRAFT, TARGET]
    cut = StepRecord(index=3, kind="verify", context_len=9, new_tokens=[4, 5], accepted=3)   # truncated at a stop
    assert token_origins(cut) == [DRAFT, DRAFT]
    assert token_origins(StepRecord(index=0, kind="prefill", context_len=0, new_tokens=[7])) == [TARGET]


def test_lane_text_marks_origin_escapes_and_keeps_whitespace(tiny):
    trace = tiny["dart"]
    out = lane_text_html(trace, "dart", special_ids=frozenset({2}))
    spans = re.findall(r'<span class="(tok tok-\w+)[^"]*" data-lane="dart" data-step="(\d+)"', out)
    assert len(spans) == len(trace.output_ids)
    expected = [(f"tok tok-{o}", str(s.index)) for s in trace.steps for o in token_origins(s)]
    assert spans == expected
    assert sum(cls == "tok tok-draft" for cls, _ in spans) == sum(s.accepted for s in trace.steps) - \
        sum(max(0, s.accepted - len(s.new_tokens)) for s in trace.steps)
    assert out.startswith('<pre class="lane-text">')
    assert "<b>bold" not in out and "&lt;b&gt;bold&lt;/b&gt;" in out     # token 8 is "<b>bold</b>"
    hand = hand_trace()
    hand.steps[0].new_tokens = [7, 9]                                     # "\n    " and "<script>x</script>"
    text = lane_text_html(hand, "dart")
    assert ">\n    </span>" in text and "<script>" not in text and "&lt;script&gt;" in text


def test_prompt_lookup_branch_nodes_say_where_they_came_from(hand):
    import copy

    trace = copy.deepcopy(hand)
    step = trace.steps[1]
    step.tree, step.lookup_nodes = step.tree.with_branch([40, 41], max_new=2)
    fig = figures.tree_figure(trace, 1)
    hovers = [h for t in node_traces(fig).values() for h in (t.hovertext or ())]
    assert sum("prompt-lookup branch" in h for h in hovers) == 2
    assert sum(len(t.x) for t in node_traces(fig).values()) == len(step.tree) + 1
