"""Plotly figures built from traces: pure functions `trace/step -> go.Figure`, no Gradio, no model.

- `tree_figure`: one step's token tree (networkx layout), node colours by fate, rich hover; the pruned view groups
  the pool per parent (`dart_core.views.pruned_groups`), and the token the target wanted where the step stopped is
  ringed.
- `rows_heatmap`: the draft rows (top-k per depth) of one step, the missed token's cell outlined.
- `accepted_length_figure`, `acceptance_by_position_figure`, `time_split_figure`: charts over a run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import networkx as nx
import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dart_core.methods import LANES, VANILLA
from dart_core.forensics.misses import BEYOND, REASON_TEXT, KnobEffect, Miss, RunForensics, run_forensics, step_miss
from dart_core.metrics import Metrics
from dart_core.ngram import NGramModel
from dart_core.proposers import PromptLookupProposer
from dart_core.budget.pool import expected_rate, pool_path
from dart_core.setup.defaults import LOOKUP_TOKENS, PLD_NGRAM
from dart_core.trace import PHASES, Trace
from dart_core.tree import TokenTree
from dart_core.tree_search import BEAM_CUT, KEPT, LOW_NGRAM, Candidates

from .pruned_groups import MAX_SHOWN, PER_PARENT, More, pruned_groups
from .text_render import plotly_escape, token_label, token_text

# Node categories, in legend order. Every node of a figure falls in exactly one.
ROOT, ACCEPTED, REJECTED, BONUS = "root", "accepted", "rejected", "bonus"
PRUNED_BUDGET, PRUNED_BEAM, PRUNED_NGRAM = "pruned_budget", "pruned_beam", "pruned_ngram"
PRUNED_MORE = "pruned_more"   # one node standing for several pruned candidates
CATEGORIES = (ROOT, ACCEPTED, REJECTED, BONUS, PRUNED_BUDGET, PRUNED_BEAM, PRUNED_NGRAM, PRUNED_MORE)
PRUNED = (PRUNED_BUDGET, PRUNED_BEAM, PRUNED_NGRAM)
COLORS = {ROOT: "#455a64", ACCEPTED: "#2e7d32", REJECTED: "#ef6c00", BONUS: "#1565c0",
          PRUNED_BUDGET: "#b0bec5", PRUNED_BEAM: "#d7ccc8", PRUNED_NGRAM: "#ce93d8", PRUNED_MORE: "#eceff1"}
NAMES = {ROOT: "root (previous step's token)", ACCEPTED: "accepted draft", REJECTED: "verified, rejected",
         BONUS: "target's bonus token", PRUNED_BUDGET: "pruned: node budget", PRUNED_BEAM: "pruned: beam cut",
         PRUNED_NGRAM: "pruned: unseen n-gram", PRUNED_MORE: "pruned: +N more, summarised"}
FATE_TEXT = {ACCEPTED: "accepted", REJECTED: "verified, rejected", ROOT: "root", BONUS: "bonus (target's own)",
             PRUNED_BUDGET: "pruned (node budget)", PRUNED_BEAM: "pruned (beam cut)",
             PRUNED_NGRAM: "pruned (unseen n-gram)"}
MISSED_COLOR, MISSED_NAME = "#c62828", "missed: the token the target wanted"   # a ring over the node
PHASE_COLORS = {"prefill": "#90a4ae", "draft": "#ffb74d", "search": "#ba68c8", "verify": "#4fc3f7",
                "accept": "#aed581"}
MAX_PRUNED = MAX_SHOWN
ROW_PX = 20          # pixels per row of leaves: more than the 11 px labels, so no two labels overlap
MIN_PLOT_PX = 240    # the plot area of a small tree
TREE_MARGIN = {"l": 10, "r": 10, "t": 70, "b": 100}   # the bottom holds the legend


def prune_category(fate: str, beam: str) -> str:
    """The pruned category of a candidate that was not kept."""
    if fate == LOW_NGRAM:
        return PRUNED_NGRAM
    return PRUNED_BEAM if beam == BEAM_CUT else PRUNED_BUDGET


def fate_label(fate: str, beam: str) -> str:
    """kept / beam cut / node budget / unseen n-gram: what the search did with a candidate."""
    if fate == KEPT:
        return "kept"
    return {PRUNED_NGRAM: "unseen n-gram", PRUNED_BEAM: "beam cut", PRUNED_BUDGET: "node budget"}[
        prune_category(fate, beam)]


def message_figure(text: str, height: int = 260) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=plotly_escape(text), x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font={"size": 15, "color": "#546e7a"})
    fig.update_layout(height=height, xaxis={"visible": False}, yaxis={"visible": False},
                      margin={"l": 10, "r": 10, "t": 10, "b": 10}, plot_bgcolor="white")
    return fig


# ---------------------------------------------------------------------------------------------- the token tree
@dataclass
class TreeNode:
    key: str                 # "n3" for tree node 3, "c17" for pruned candidate 17, "bonus", "m…" for +N more
    parent: str | None       # None: the root, or a node below the tree (the rest of a depth)
    token: int
    text: str                # the token's text (raw; escaped when drawn)
    depth: int
    category: str
    hover: str
    order: float = 0.0       # sort key among siblings
    label: str | None = None  # drawn as is (escaped) instead of the token's label


@dataclass
class TreeView:
    nodes: list[TreeNode]
    title: str
    notes: list[str] = field(default_factory=list)
    missed: dict[str, str] = field(default_factory=dict)   # node key -> what the target wanted there, and why


def _cand_hover(c: Candidates, i: int, context: list[int], trace: Trace) -> list[str]:
    lines = [f"draft prob: {c.draft_prob[i]:.4f}"]
    match = int(c.ngram_match[i])
    if match < 0:
        lines.append("n-gram: not used at this level")
    elif match == 0:
        lines.append(f"n-gram prob: 0 (unseen after its context) · term {c.ngram_term[i]:.3f}")
    else:
        path = []
        j = int(c.parent[i])
        while j >= 0:
            path.append(int(c.token[j]))
            j = int(c.parent[j])
        seq = context + path[::-1]
        matched = "".join(token_text(trace, t) for t in seq[-match:])
        lines.append(f"n-gram prob: {c.ngram_prob[i]:.4f} · term {c.ngram_term[i]:.3f}")
        lines.append(f"matched context ({match} token{'s' if match > 1 else ''}): "
                     f"{token_label(matched, 40)}")
    lines.append(f"level weight: {c.level_weight[i]:.3f} · logit term {c.logit_term[i]:.3f}")
    lines.append(f"cumulative score: {c.score[i]:.3f}")
    lines.append(f"beam: {c.beam[i]}")
    return lines


@dataclass(frozen=True)
class TreeOptions:
    """How a tree is drawn: its title, and whether the pruned candidates join it (how many in all, and per parent)."""
    title: str = ""
    show_pruned: bool = False
    max_pruned: int = MAX_PRUNED
    per_parent: int = PER_PARENT


def tree_view(trace: Trace, tree: TokenTree, path: list[int], bonus: int | None, candidates: Candidates | None,
              context: list[int], lookup_nodes=(), options: TreeOptions = TreeOptions()) -> TreeView:
    """Nodes of a tree figure: the verified tree, the bonus token, and optionally the pruned candidates, grouped per
    parent (see dart_core.views.pruned_groups)."""
    show_pruned, max_pruned, per_parent = options.show_pruned, options.max_pruned, options.per_parent
    title = options.title
    accepted = set(path[1:])
    cand_of_node: dict[int, int] = {}
    if candidates is not None and len(candidates):
        for ci in np.flatnonzero(candidates.node > 0).tolist():
            cand_of_node[int(candidates.node[ci])] = ci
    nodes: list[TreeNode] = []
    for n, tok in enumerate(tree.tokens):
        if n == 0:
            cat = ROOT
        else:
            cat = ACCEPTED if n in accepted else REJECTED
        head = f"<b>{token_label(token_text(trace, tok), 40)}</b> (id {tok}) · node {n} · depth {tree.depths[n]}"
        lines = [head, f"fate: {FATE_TEXT[cat]}"]
        if n in cand_of_node:
            lines += _cand_hover(candidates, cand_of_node[n], context, trace)
        elif n in lookup_nodes:
            lines.append("from the prompt-lookup branch: copied from an earlier place in the context")
        score = float(candidates.score[cand_of_node[n]]) if n in cand_of_node else 0.0
        parent = None if n == 0 else f"n{tree.parents[n]}"
        nodes.append(TreeNode(f"n{n}", parent, tok, token_text(trace, tok), tree.depths[n], cat, "<br>".join(lines),
                              order=-score + n * 1e-9))
    if bonus is not None:
        last = path[-1] if path else 0
        nodes.append(TreeNode("bonus", f"n{last}", bonus, token_text(trace, bonus), tree.depths[last] + 1, BONUS,
                              f"<b>{token_label(token_text(trace, bonus), 40)}</b> (id {bonus})<br>"
                              f"fate: the target's own token after the accepted path", order=1e9))
    notes = []
    if show_pruned and candidates is not None and len(candidates):
        groups = pruned_groups(candidates, per_parent, max_pruned)
        for ci in groups.shown:
            cat = prune_category(str(candidates.fate[ci]), str(candidates.beam[ci]))
            tok = int(candidates.token[ci])
            lines = [f"<b>{token_label(token_text(trace, tok), 40)}</b> (id {tok}) · candidate {ci} · "
                     f"depth {int(candidates.level[ci]) + 1}", f"fate: {FATE_TEXT[cat]}"]
            lines += _cand_hover(candidates, ci, context, trace)
            nodes.append(TreeNode(f"c{ci}", candidate_key(candidates, int(candidates.parent[ci])), tok,
                                  token_text(trace, tok), int(candidates.level[ci]) + 1, cat, "<br>".join(lines),
                                  order=1e6 - float(candidates.score[ci])))
        nodes += [_more_node(trace, candidates, m, tree.tokens[0]) for m in groups.more]
        if groups.more:
            notes.append(f"showing the {len(groups.shown)} best-scored of {groups.total} pruned candidates "
                         f"(at most {per_parent} per parent); “+N more” nodes count the rest")
    elif show_pruned:
        notes.append("this step has no recorded candidates (not a DART step)")
    return TreeView(nodes, title, notes)


def candidate_key(c: Candidates, ci: int) -> str:
    """The figure key of candidate `ci` (-1: the root): its tree node when it was kept."""
    if ci < 0:
        return "n0"
    return f"n{int(c.node[ci])}" if c.node[ci] > 0 else f"c{ci}"


def _more_node(trace: Trace, c: Candidates, more: More, root_token: int) -> TreeNode:
    """One node for the pruned candidates `more` stands for; a depth's rest hangs below the tree, with no edge."""
    n, best = len(more.members), more.best(c)
    if more.parent is None:
        where, parent, key, order = "(the rest of this depth)", None, f"m{more.depth}", float(more.depth)
    else:
        tok = root_token if more.parent < 0 else int(c.token[more.parent])
        where = f"under “{token_label(token_text(trace, tok), 40)}”"
        parent, key, order = candidate_key(c, more.parent), f"m{more.depth}:{more.parent}", 5e8
    fates = Counter(fate_label(str(c.fate[i]), str(c.beam[i])) for i in more.members)
    best_tokens = ", ".join(f"“{token_label(token_text(trace, int(c.token[i])), 20)}”" for i in more.members[:5])
    hover = "<br>".join([f"<b>+{n} more</b> pruned candidate{'s' if n > 1 else ''} at depth {more.depth} {where}",
                         f"best score: {best:.3f}", " · ".join(f"{k} {v}" for k, v in fates.items()),
                         f"best of them: {best_tokens}{'…' if n > 5 else ''}"])
    return TreeNode(key, parent, -1, "", more.depth, PRUNED_MORE, hover, order, label=f"+{n} more (best {best:.2f})")


def tree_layout(nodes: list[TreeNode]) -> dict[str, tuple[float, float]]:
    """Tidy tree layout: depth to the right, leaves one row each top to bottom in DFS order, parents centred; the
    nodes without a parent besides the root get a row each below the tree. y is minus the row."""
    g = nx.DiGraph()
    tree = [n for n in nodes[1:] if n.parent is not None]
    for node in [nodes[0], *tree]:
        g.add_node(node.key, order=node.order, depth=node.depth)
        if node.parent is not None:
            g.add_edge(node.parent, node.key)
    assert nx.is_arborescence(g), "a draft tree must be a tree"
    ys: dict[str, float] = {}
    next_leaf = 0

    def visit(key: str) -> float:  # recursion depth = tree depth (a few dozen at most)
        nonlocal next_leaf
        kids = sorted(g.successors(key), key=lambda k: g.nodes[k]["order"])
        if not kids:
            ys[key] = float(next_leaf)
            next_leaf += 1
        else:
            ys[key] = float(np.mean([visit(k) for k in kids]))
        return ys[key]

    visit(nodes[0].key)
    pos = {k: (float(g.nodes[k]["depth"]), -ys[k]) for k in g.nodes}
    below = sorted((n for n in nodes[1:] if n.parent is None), key=lambda n: n.order)
    pos.update({n.key: (float(n.depth), -float(next_leaf + j)) for j, n in enumerate(below)})
    return pos


EDGE_LINES = {"tree": {"color": "#b0bec5", "width": 1.2}, "pruned": {"color": "#e0e0e0", "width": 1, "dash": "dot"},
              "accepted": {"color": COLORS[ACCEPTED], "width": 3}, "bonus": {"color": COLORS[BONUS], "width": 2,
                                                                             "dash": "dash"}}
# The edge style into a node of each category (the root has no edge).
EDGE_OF = {REJECTED: "tree", ACCEPTED: "accepted", BONUS: "bonus", **dict.fromkeys((*PRUNED, PRUNED_MORE), "pruned")}


def edge_traces(nodes: list[TreeNode], pos: dict, edge_of: dict = EDGE_OF, keep_empty: bool = False) -> list:
    """One line trace per edge style, each edge from a node's parent to it. `keep_empty`: a trace even for a style
    with no edge (an animation's frames must all hold the same traces)."""
    out = []
    for name, line in EDGE_LINES.items():
        xs, ys = [], []
        for n in nodes:
            if n.parent is not None and edge_of.get(n.category) == name:
                (x0, y0), (x1, y1) = pos[n.parent], pos[n.key]
                xs += [x0, x1, None]
                ys += [y0, y1, None]
        if xs or keep_empty:
            out.append(go.Scatter(x=xs, y=ys, mode="lines", line=line, hoverinfo="skip", showlegend=False,
                                  name=f"edges: {name}"))
    return out


def node_trace(group: list[TreeNode], pos: dict, name: str, color: str, faint: bool = False, square: bool = False,
               left: bool = False) -> go.Scatter:
    """The nodes of one category as markers with their labels (faint: smaller, grey labels; left: label on the
    left, as the root's)."""
    return go.Scatter(
        x=[pos[n.key][0] for n in group], y=[pos[n.key][1] for n in group], mode="markers+text", name=name,
        text=[n.label if n.label is not None else token_label(n.text) for n in group],
        customdata=[n.key for n in group], textposition="middle left" if left else "middle right",
        textfont={"size": 11, "color": "#78909c" if faint else "#263238"},
        marker={"color": color, "size": 8 if faint else 12, "symbol": "square" if square else "circle",
                "line": {"color": "#78909c" if square else "white", "width": 1}},
        hovertext=[n.hover for n in group], hoverinfo="text")


def tree_axes(pos: dict, depth: int, margin: dict = TREE_MARGIN) -> dict:
    """Height and axes for nodes at `pos` (y is minus the row): ROW_PX per row at least, depths 0..depth across."""
    rows = 1 - min(y for _, y in pos.values())
    plot_px = max(MIN_PLOT_PX, ROW_PX * (rows + 0.2))   # the y range below spans rows + 0.2: ROW_PX per row at least
    return {"height": int(plot_px + margin["t"] + margin["b"]), "margin": margin,
            "xaxis": {"title": "depth", "dtick": 1, "range": [-0.6, depth + 0.9], "zeroline": False,
                      "showgrid": False},
            "yaxis": {"visible": False, "range": [-(rows - 1) - 0.6, 0.6]}}


def tree_figure_from_view(view: TreeView) -> go.Figure:
    pos = tree_layout(view.nodes)
    fig = go.Figure(edge_traces(view.nodes, pos))
    for cat in CATEGORIES:
        group = [n for n in view.nodes if n.category == cat]
        if group:
            fig.add_trace(node_trace(group, pos, NAMES[cat], COLORS[cat], faint=cat in PRUNED or cat == PRUNED_MORE,
                                     square=cat == PRUNED_MORE, left=cat == ROOT))
    if view.missed:
        keys = list(view.missed)
        fig.add_trace(go.Scatter(
            x=[pos[k][0] for k in keys], y=[pos[k][1] for k in keys], mode="markers", name=MISSED_NAME,
            customdata=keys, marker={"symbol": "circle-open", "size": 22, "color": MISSED_COLOR,
                                     "line": {"color": MISSED_COLOR, "width": 3}},
            hovertext=list(view.missed.values()), hoverinfo="text"))
    title = plotly_escape(view.title) + "".join(f"<br><sup>{plotly_escape(note)}</sup>" for note in view.notes)
    fig.update_layout(
        title={"text": title, "x": 0.01}, **tree_axes(pos, max(n.depth for n in view.nodes)), plot_bgcolor="white",
        hovermode="closest", legend={"orientation": "h", "y": -0.02, "yanchor": "top", "x": 0})
    return fig


def missed_token(trace: Trace, index: int) -> Miss | None:
    """What the target wanted where step `index` stopped short, or None: nothing missed, or the step accepted all
    the head drafted (the next token lies beyond its rows, so no tree could hold it)."""
    miss = step_miss_of(trace, index)
    return miss if miss is not None and miss.reason != BEYOND else None


def _missed_marks(trace: Trace, index: int, miss: Miss, view: TreeView) -> dict[str, str]:
    """Where the figure rings the missed token: the bonus (the target's own token, just where the draft would have
    hung), and its pool candidate when the figure draws it."""
    step = trace.steps[index]
    text = "<b>missed</b>: " + plotly_escape(miss.text(lambda t: token_text(trace, t)))
    marks = {"bonus": text}
    walk = pool_path(step.candidates.token, step.candidates.parent, step.new_tokens[:miss.depth])
    if len(walk) == miss.depth and (key := candidate_key(step.candidates, walk[-1])) in {n.key for n in view.nodes}:
        marks[key] = text
    return marks


def tree_figure(trace: Trace, index: int, show_pruned: bool = False, max_pruned: int = MAX_PRUNED) -> go.Figure:
    """The token tree of step `index` of a trace."""
    if not 0 <= index < len(trace.steps):
        return message_figure(f"no step {index} in this trace")
    step = trace.steps[index]
    if step.tree is None:
        return message_figure(f"Step {index} is the prefill: the target reads the prompt and picks the first token "
                              f"itself; there is no draft tree yet.")
    bonus = step.new_tokens[-1] if len(step.new_tokens) == step.accepted + 1 else None
    title = (f"Step {index}: {len(step.tree) - 1} draft nodes, {step.accepted} accepted"
             + (" + bonus" if bonus is not None else ""))
    view = tree_view(trace, step.tree, step.path, bonus, step.candidates, trace.context_at(index), step.lookup_nodes,
                     TreeOptions(title, show_pruned, max_pruned))
    if (miss := missed_token(trace, index)) is not None:
        view.missed = _missed_marks(trace, index, miss, view)
        view.notes.insert(0, "ringed: the target " + miss.text(lambda t: token_text(trace, t)))
    return tree_figure_from_view(view)


# ---------------------------------------------------------------------------------------------- draft rows
def rows_heatmap(trace: Trace, index: int) -> go.Figure:
    """DART's draft rows of one step: depth x rank, coloured by draft prob, labelled with the token."""
    if not 0 <= index < len(trace.steps):
        return message_figure(f"no step {index} in this trace")
    step = trace.steps[index]
    if step.rows_tokens is None or step.rows_probs is None:
        return message_figure("no draft rows in this step (prefill, plain decoding or prompt lookup)")
    rows_t, rows_p = step.rows_tokens, step.rows_probs
    R, k = rows_t.shape
    in_tree: set[tuple[int, int]] = set()
    if step.tree is not None:
        in_tree = {(step.tree.depths[n], step.tree.tokens[n]) for n in range(1, len(step.tree))}
    on_path = {(d, step.tree.tokens[n]) for d, n in enumerate(step.path)} if step.tree is not None else set()
    miss = missed_token(trace, index)
    wanted_row = [int(t) for t in rows_t[miss.depth - 1]] if miss is not None else []   # a miss is within the rows
    missed_cell = (miss.depth - 1, wanted_row.index(miss.token)) if miss and miss.token in wanted_row else None
    text, hover = [], []
    for r in range(R):
        trow, hrow = [], []
        for j in range(k):
            tok = int(rows_t[r, j])
            mark = "✓" if (r + 1, tok) in on_path else ("•" if (r + 1, tok) in in_tree else "")
            trow.append(token_label(token_text(trace, tok), 8) + mark)
            where = ("accepted at this depth" if mark == "✓" else "in the tree at this depth" if mark == "•"
                     else "not in the tree at this depth")
            if (r, j) == missed_cell:
                where += "<br><b>missed</b>: the target wanted this token here"
            hrow.append(f"<b>{token_label(token_text(trace, tok), 40)}</b> (id {tok})<br>depth {r + 1} · rank {j + 1}"
                        f"<br>draft prob {rows_p[r, j]:.4f}<br>{where}")
        text.append(trow)
        hover.append(hrow)
    fig = go.Figure(go.Heatmap(z=rows_p, x=[str(j + 1) for j in range(k)], y=[f"depth {r + 1}" for r in range(R)],
                               text=text, texttemplate="%{text}", hovertext=hover, hoverinfo="text",
                               colorscale="Oranges", zmin=0, zmax=1, colorbar={"title": "draft p"}))
    title = f"Step {index}: draft rows (✓ accepted, • in the tree)"
    if miss is not None:
        wanted = f"the target wanted “{token_label(token_text(trace, miss.token), 20)}” at depth {miss.depth}"
        if missed_cell is None:
            title += f"<br><sup>{wanted}: not in the top-k of that row</sup>"
        else:
            r, j = missed_cell   # categorical axes: the cell of row r, column j spans r ± 0.5, j ± 0.5
            fig.add_shape(type="rect", x0=j - 0.5, x1=j + 0.5, y0=r - 0.5, y1=r + 0.5, name="missed",
                          line={"color": MISSED_COLOR, "width": 3})
            title += (f"<br><sup>outlined: {wanted} (the head's guess no. {j + 1}): "
                      f"{plotly_escape(REASON_TEXT[miss.reason])}</sup>")
    fig.update_layout(title={"text": title, "x": 0.01}, xaxis={"title": "rank in the row"},
                      yaxis={"autorange": "reversed"}, height=max(280, 110 + 48 * R),
                      margin={"l": 10, "r": 10, "t": 70, "b": 40})
    return fig


# ---------------------------------------------------------------------------------------------- run charts
def _verify_steps(trace: Trace):
    return [s for s in trace.steps if s.kind == "verify"]


def _lane_name(lane: str) -> str:
    """A lane's short name for legends and titles; a key of no lane (none given, say) stands as it is."""
    return LANES[lane].short if lane in LANES else lane


def _lane_colour(lane: str) -> str | None:
    return LANES[lane].colour if lane in LANES else None   # None: plotly's next colour


def accepted_length_figure(traces: dict[str, Trace]) -> go.Figure:
    """Tokens emitted per verify step (accepted drafts + bonus), one bar series per lane."""
    fig = go.Figure()
    for lane, trace in traces.items():
        steps = _verify_steps(trace)
        if not steps or lane == VANILLA:
            continue
        fig.add_trace(go.Bar(x=[s.index for s in steps], y=[s.accepted for s in steps],
                             name=_lane_name(lane), marker_color=_lane_colour(lane),
                             hovertemplate="step %{x}: %{y} accepted<extra></extra>"))
    if not fig.data:
        return message_figure("no drafting steps yet")
    fig.update_layout(title={"text": "Accepted draft tokens per step (plain decoding accepts 0)", "x": 0.01},
                      xaxis={"title": "step"}, yaxis={"title": "accepted", "rangemode": "tozero"}, barmode="group",
                      height=300, margin={"l": 10, "r": 10, "t": 50, "b": 40})
    return fig


def acceptance_by_position_figure(traces: dict[str, Trace]) -> go.Figure:
    """Per depth d: the share of steps that accepted at least d drafts (bars) and the conditional rate (line)."""
    fig = go.Figure()
    for lane, trace in traces.items():
        if lane == VANILLA:
            continue
        m = Metrics.from_steps(trace.steps)
        if not m.verify_steps:
            continue
        reach = m.acceptance_by_depth
        name = _lane_name(lane)
        fig.add_trace(go.Bar(x=list(range(1, len(reach) + 1)), y=reach, name=f"{name}: reached depth",
                             marker_color=_lane_colour(lane),
                             hovertemplate="depth %{x}: %{y:.1%} of steps<extra></extra>"))
        cond = m.conditional_acceptance
        fig.add_trace(go.Scatter(x=list(range(1, len(cond) + 1)), y=cond, name=f"{name}: accepted given reached",
                                 mode="lines+markers", line={"color": _lane_colour(lane), "dash": "dash"},
                                 hovertemplate="depth %{x}: %{y:.1%}<extra></extra>"))
    if not fig.data:
        return message_figure("no drafting steps yet")
    if all(len(t.x) == 0 for t in fig.data):
        return message_figure("no draft token accepted yet")
    fig.update_layout(title={"text": "Acceptance per draft position", "x": 0.01}, xaxis={"title": "depth", "dtick": 1},
                      yaxis={"title": "share of steps", "range": [0, 1.05], "tickformat": ".0%"}, height=300,
                      margin={"l": 10, "r": 10, "t": 50, "b": 40})
    return fig


def time_split_figure(trace: Trace, lane: str = "") -> go.Figure:
    """Seconds per step, stacked by phase (prefill / draft / search / verify / accept)."""
    if not trace.steps:
        return message_figure("no steps yet")
    fig = go.Figure()
    x = [s.index for s in trace.steps]
    for phase in ("prefill",) + PHASES:
        y = [s.timings.get(phase, 0.0) * 1000 for s in trace.steps]
        if any(y):
            fig.add_trace(go.Bar(x=x, y=y, name=phase, marker_color=PHASE_COLORS.get(phase),
                                 hovertemplate=f"step %{{x}}: %{{y:.1f}} ms {phase}<extra></extra>"))
    name = _lane_name(lane)
    fig.update_layout(title={"text": f"Time per step{f' ({name})' if name else ''}", "x": 0.01}, barmode="stack",
                      xaxis={"title": "step"}, yaxis={"title": "ms"}, height=300,
                      margin={"l": 10, "r": 10, "t": 50, "b": 40})
    return fig


# ---------------------------------------------------------------------------------------------- cost on this machine
def cost_figure(trace: Trace | None) -> go.Figure:
    """The trade-off of speculative decoding on the machine a DART trace ran on: what a verify of k tokens costs in
    one-token forwards (t(k)/t(1), measured), and the speedup over plain decoding each node budget is expected to
    give with the acceptance this run measured; the budget the run chose is marked."""
    machine = trace.settings.machine if trace is not None else None
    curve = machine.cost_curve if machine is not None else None
    if curve is None:
        return message_figure("Run DART with an automatic node budget to see what trees cost on this machine.")
    # the run may have corrected the curve against its own verify times (dart_core.budget.auto): the last one counts
    budgets = [s.budget for s in reversed(trace.steps) if s.budget is not None]
    fix = next((b.curve for b in budgets if b.curve is not None), None)
    if fix is not None:
        curve = fix.curve
    choice = next((b.choice for b in budgets if b.choice is not None), None)
    ks = list(range(1, curve.rows[-1] + 1))
    name = "verify cost t(1+n) / t(1), fitted" + (f" ({fix.action}: the run measured {fix.ratio:.2f}×)"
                                                   if fix else "")
    fig = go.Figure(go.Scatter(x=[k - 1 for k in ks], y=[curve.relative(k) for k in ks], mode="lines",
                               name=name, line={"color": "#4fc3f7"},
                               hovertemplate="%{x} draft nodes: a verify costs %{y:.2f} one-token forwards"
                                             "<extra></extra>"))
    if curve.measured is not None:   # the medians the fit was made from: how noisy the measurement was
        t1 = curve.seconds[0]
        fig.add_trace(go.Scatter(x=[k - 1 for k in curve.rows], y=[m / t1 for m in curve.measured], mode="markers",
                                 name="measured (median)", marker={"color": "#0277bd", "size": 7},
                                 hovertemplate="%{x} draft nodes: measured %{y:.2f} one-token forwards"
                                               "<extra></extra>"))
    weighed = choice.curve if choice is not None and choice.curve is not None else curve
    if weighed is not curve:   # the curve as the run's own verifies measured it: what the choice weighed
        fig.add_trace(go.Scatter(x=[k - 1 for k in ks], y=[weighed.relative(k) for k in ks], mode="lines",
                                 name="as this run's verifies measured it", line={"color": "#4fc3f7", "dash": "dot"},
                                 hovertemplate="%{x} draft nodes: a verify took %{y:.2f} one-token forwards"
                                               "<extra></extra>"))
    if choice is not None and choice.tokens_by_budget:
        t1, overhead = weighed.seconds[0], choice.overhead_s
        budgets = list(range(1, len(choice.tokens_by_budget)))
        # over plain decoding's 1 / t(1): the expected rate with each token counted as t(1)
        speedup = expected_rate(t1 * np.asarray(choice.tokens_by_budget[1:]), np.asarray(choice.nodes_by_budget[1:]),
                                overhead, weighed).tolist()
        fig.add_trace(go.Scatter(x=budgets, y=speedup, mode="lines", name="expected speedup over plain decoding",
                                 line={"color": "#ef6c00"},
                                 hovertemplate="node budget %{x}: expected %{y:.2f}× plain decoding<extra></extra>"))
        b = choice.budget   # 0: plain decoding won (no drafting), its speedup over itself is 1
        fig.add_trace(go.Scatter(x=[b], y=[speedup[b - 1] if b else 1.0], mode="markers+text", name="chosen budget",
                                 text=[f"chosen: {b}" if b else "chosen: plain decoding"],
                                 textposition="top center", marker={"color": "#2e7d32", "size": 12}))
    hardware = plotly_escape(machine.summary)
    fig.update_layout(title={"text": f"Cost on this machine<br><sup>{hardware}</sup>", "x": 0.01},
                      xaxis={"title": "draft nodes (node budget)"}, yaxis={"title": "× one-token forward"},
                      height=320, margin={"l": 10, "r": 10, "t": 60, "b": 40},
                      legend={"orientation": "h", "y": -0.25})
    return fig


# ---------------------------------------------------------------------------------------------- why tokens were missed
def lookup_probe(trace: Trace) -> PromptLookupProposer:
    """The prompt-lookup branch dart_pld grafts: the run's own, or the default one a dart run could have had."""
    return PromptLookupProposer(max_ngram=PLD_NGRAM, num_tokens=trace.settings.lookup_tokens or LOOKUP_TOKENS)


def step_miss_of(trace: Trace, index: int) -> Miss | None:
    """step_miss, with the lookup branch a dart run could have had tried as well."""
    return step_miss(trace, index, lookup_probe(trace))


def forensics_of(trace: Trace, ngram: NGramModel | None = None, replay: bool = True) -> RunForensics:
    return run_forensics(trace, PLD_NGRAM, LOOKUP_TOKENS, ngram, replay)


def misses_figure(trace: Trace | None, ngram: NGramModel | None = None, replay: bool = True,
                  found: RunForensics | None = None) -> go.Figure:
    """Over a DART run: why each step stopped short (at the first rejected position), and what each knob would
    have recovered, replayed from the recorded steps (exact for greedy runs). `replay`: rerun the search for the
    n-gram weight and beam width too (`ngram`: the run's table); `found`: the forensics already computed."""
    if trace is None or not trace.uses_tree_search:
        return message_figure("Run DART (or upload a DART trace) to see why tokens were missed.")
    found = found or forensics_of(trace, ngram, replay)
    counts = found.counts
    if not counts:
        return message_figure("No DART step stopped short in this run.")
    fig = make_subplots(rows=2, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.12, vertical_spacing=0.2,
                        specs=[[{}, {}], [{"colspan": 2}, None]], row_heights=[0.55, 0.45],
                        subplot_titles=("why the wanted token was not accepted (steps)",
                                        "accepted tokens another node budget would add",
                                        "accepted tokens the other knobs would add (each alone, at each step's own "
                                        "node budget)"))
    fig.add_trace(go.Bar(y=[plotly_escape(REASON_TEXT[r]) for r in counts], x=list(counts.values()),
                         orientation="h", marker_color="#ef6c00", name="steps",
                         hovertemplate="%{x} steps: %{y}<extra></extra>"), row=1, col=1)
    flags = {"of these: the tree had it under another parent": sum(m.elsewhere for m in found.misses),
             "of these: dart_pld's lookup branch would have offered it": sum(m.lookup for m in found.misses)}
    flags = {k: v for k, v in flags.items() if v}
    if flags:
        fig.add_trace(go.Bar(y=list(flags), x=list(flags.values()), orientation="h", marker_color="#90a4ae",
                             name="also", hovertemplate="%{x} steps: %{y}<extra></extra>"), row=1, col=1)
    if found.budgets:
        fig.add_trace(_effect_bars(found.budgets, [str(e.value) for e in found.budgets], "#2e7d32"), row=1, col=2)
    if found.knobs:
        fig.add_trace(_effect_bars(found.knobs, [e.label for e in found.knobs], "#1565c0"), row=2, col=1)
    how = "exact: greedy" if trace.settings.sampling.greedy else ""
    sub = " · ".join([how] * bool(how) + found.notes)
    fig.update_layout(title={"text": f"Why tokens were missed<br><sup>{plotly_escape(sub)}</sup>", "x": 0.01},
                      height=560, showlegend=False, margin={"l": 10, "r": 10, "t": 80, "b": 40})
    fig.update_xaxes(title_text="node budget", row=1, col=2)
    return fig


def _effect_bars(effects: list[KnobEffect], labels: list[str], color: str) -> go.Bar:
    return go.Bar(x=labels, y=[e.extra_tokens for e in effects], marker_color=color, name="tokens",
                  customdata=[[e.label, round(e.extra_nodes, 1)] for e in effects],
                  hovertemplate="%{customdata[0]}: %{y:+d} tokens in this run, %{customdata[1]:+} nodes per "
                                "forward<extra></extra>")
