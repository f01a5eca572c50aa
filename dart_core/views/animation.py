"""A DART step as a short animation, and a whole run step by step: plotly frames with play / pause buttons and a
slider, so they play in the browser with no server round trip (in the app and in the exported report alike).

- `step_animation`: the head's rows, then the beam search level by level (what each level considered, which paths
  the beam kept to extend, the node-budget cut so far), the kept tree, the verification, and the accepted path
  with the bonus token. Every frame draws from one layout of all the nodes any frame shows, so the tree grows in
  place.
- `run_animation`: one frame per step, each the step's tree with its accepted path.

Frames stay small: per level the tree's own candidates and at most PER_LEVEL others are drawn (the rest counted
in one "+M more" node), and hovers are short. Every frame holds the same traces, as plotly's animation needs.
"""

from __future__ import annotations

import textwrap
from dataclasses import replace

import numpy as np
import plotly.graph_objects as go

from dart_core.trace import StepRecord, Trace
from dart_core.tree_search import BEAM_CUT, EOS_END, EXPANDED, LAST_LEVEL, Candidates

from .figures import (ACCEPTED, BONUS, COLORS, EDGE_OF, NAMES, PHASE_COLORS, PRUNED, PRUNED_BEAM, PRUNED_MORE,
                      REJECTED, ROOT, TreeNode, candidate_key, edge_traces, fate_label, message_figure, node_trace,
                      prune_category, tree_axes, tree_layout, tree_view)
from .text_render import plotly_escape, token_label, token_text

SPEEDS = (0.5, 1.0, 2.0)
FRAME_MS = 1800          # one frame at 1x: time to read its caption
PER_LEVEL = 12           # candidates drawn per level besides the tree's own
CUT_SHOWN = 3            # of them, the best ones the beam did not extend, where a level has such: where the beam cut
CAPTION_CHARS = 120      # caption lines are wrapped by hand: plotly does not wrap annotations
MARGIN = {"l": 10, "r": 10, "t": 150, "b": 120}   # the title and caption above, the buttons and slider below

# Categories of the animation besides the tree figure's own (root, accepted, rejected, bonus, pruned).
GUESS, EXTENDED, NOT_EXTENDED, DRAFT, UNREACHED = "guess", "extended", "not_extended", "draft", "unreached"
STYLES = {   # category -> (name in the caption's key, colour, faint); one trace each, in this order
    ROOT: (NAMES[ROOT], COLORS[ROOT], False),
    GUESS: ("the head's guess", PHASE_COLORS["draft"], False),
    EXTENDED: ("extended by the beam", "#00897b", False),
    NOT_EXTENDED: ("not extended (beam cut, EOS or the last row)", COLORS[PRUNED_BEAM], True),
    DRAFT: ("draft node", "#5c6bc0", False),
    **{cat: (NAMES[cat], COLORS[cat], True) for cat in (*PRUNED, PRUNED_MORE)},
    ACCEPTED: ("the target's choice: accepted", COLORS[ACCEPTED], False),
    REJECTED: ("not the target's choice", COLORS[REJECTED], False),
    UNREACHED: ("under a rejected node: never compared", "#ffe0b2", True),
    BONUS: (NAMES[BONUS], COLORS[BONUS], False),
}
EDGES = {**EDGE_OF, EXTENDED: "tree", NOT_EXTENDED: "pruned", DRAFT: "tree", UNREACHED: "tree"}
RING, RING_COLOR = "within the node budget so far", STYLES[DRAFT][1]
BEAM_TEXT = {EXPANDED: "extended", BEAM_CUT: "cut", EOS_END: "ends in EOS", LAST_LEVEL: "the last row"}


# ---------------------------------------------------------------------------------------------- frames and player
def _caption(text: str, cats: list[str], ring: bool) -> dict:
    """The frame's words, wrapped, then a colour key of what it draws."""
    key = [f'<span style="color:{STYLES[c][1]}">●</span> {STYLES[c][0]}' for c in STYLES if c in cats]
    if ring:
        key.append(f'<span style="color:{RING_COLOR}">○</span> {RING}')
    lines = textwrap.wrap(text, CAPTION_CHARS, break_long_words=False, break_on_hyphens=False)
    lines += ["   ".join(key[i:i + 4]) for i in range(0, len(key), 4)]
    return {"text": "<br>".join(lines), "x": 0, "y": 1, "xref": "paper", "yref": "paper", "xanchor": "left",
            "yanchor": "bottom", "yshift": 8, "align": "left", "showarrow": False,
            "font": {"size": 12, "color": "#37474f"}}


def _frame(name: str, shown: list[TreeNode], pos: dict, caption: str, ring=()) -> go.Frame:
    """One frame: the edges, one node trace per category (empty where the frame has none), the ring."""
    data = edge_traces(shown, pos, EDGES, keep_empty=True)
    for cat, (label, color, faint) in STYLES.items():
        data.append(node_trace([n for n in shown if n.category == cat], pos, label, color, faint,
                               square=cat == PRUNED_MORE, left=cat == ROOT))
    data.append(go.Scatter(x=[pos[k][0] for k in ring], y=[pos[k][1] for k in ring], mode="markers", name=RING,
                           customdata=list(ring), hoverinfo="skip",
                           marker={"symbol": "circle-open", "size": 20, "color": RING_COLOR,
                                   "line": {"color": RING_COLOR, "width": 2}}))
    annotation = _caption(caption, [n.category for n in shown], bool(ring))
    return go.Frame(name=name, data=data, layout={"annotations": [annotation]})


def _player(frames: list[go.Frame], title: str, axes: dict, speed: float) -> go.Figure:
    """The figure showing the first frame, with play / pause buttons and a slider over the frame names."""
    ms = int(FRAME_MS / speed)
    play = {"frame": {"duration": ms, "redraw": True}, "fromcurrent": True, "transition": {"duration": ms // 6}}
    still = {"frame": {"duration": 0, "redraw": True}, "mode": "immediate", "transition": {"duration": 0}}
    fig = go.Figure(data=frames[0].data, frames=frames)
    fig.update_layout(
        title={"text": plotly_escape(title), "x": 0.01, "y": 0.99, "yanchor": "top"}, **axes,
        annotations=frames[0].layout.annotations, showlegend=False, plot_bgcolor="white", hovermode="closest",
        updatemenus=[{"type": "buttons", "direction": "left", "showactive": False, "x": 0, "y": 0, "xanchor": "left",
                      "yanchor": "top", "pad": {"t": 45, "r": 10},
                      "buttons": [{"label": "▶ Play", "method": "animate", "args": [None, play]},
                                  {"label": "❚❚ Pause", "method": "animate", "args": [[None], still]}]}],
        sliders=[{"active": 0, "x": 0.2, "len": 0.8, "y": 0, "yanchor": "top", "pad": {"t": 35},
                  "currentvalue": {"prefix": "now: "},
                  "steps": [{"label": f.name, "method": "animate", "args": [[f.name], still]} for f in frames]}])
    return fig


def _message(text: str) -> go.Figure:
    """A figure of one frame that says why there is nothing to animate."""
    fig = message_figure(text)
    fig.frames = [go.Frame(name="message", layout={"annotations": fig.layout.annotations})]
    return fig


# ---------------------------------------------------------------------------------------------- one step
def _drawn(c: Candidates) -> tuple[set[int], dict[int, list[int]]]:
    """The candidates drawn: all of the tree's, and per level at most PER_LEVEL others whose parent is drawn, the
    best-scored (CUT_SHOWN of them not extended, where the level has such); and per depth the rest, best first."""
    drawn = set(np.flatnonzero(c.node > 0).tolist())
    rest = {}
    for level in np.unique(c.level).tolist():
        idx = np.flatnonzero(c.level == level)
        idx = idx[np.argsort(-c.score[idx], kind="stable")].tolist()
        free = [i for i in idx if c.node[i] <= 0 and (c.parent[i] < 0 or int(c.parent[i]) in drawn)]
        cut = [i for i in free if c.beam[i] != EXPANDED]
        take = [i for i in free if c.beam[i] == EXPANDED][:PER_LEVEL - min(len(cut), CUT_SHOWN)]
        take += cut[:PER_LEVEL - len(take)]
        drawn.update(take)
        rest[level + 1] = [i for i in idx if i not in drawn]
    return drawn, rest


def _hover(trace: Trace, c: Candidates, i: int) -> str:
    text = token_label(token_text(trace, int(c.token[i])), 30)
    return (f"<b>{text}</b> · depth {int(c.level[i]) + 1} · score {c.score[i]:.2f} · draft p {c.draft_prob[i]:.2f}"
            f"<br>beam: {BEAM_TEXT[c.beam[i]]} · in the end: {fate_label(str(c.fate[i]), str(c.beam[i]))}")


def _step_nodes(trace: Trace, step: StepRecord, bonus: int | None) -> tuple[list[TreeNode], dict, dict]:
    """Every node some frame of the step shows but the head's guesses: the tree (and its bonus) as the tree figure
    has them, the other drawn candidates, a "+M more" per depth. Also: node key -> candidate index of every drawn
    candidate, and per depth the candidates not drawn."""
    c = step.candidates
    drawn, rest = _drawn(c)
    cand = {candidate_key(c, i): i for i in sorted(drawn)}   # "n3" for tree node 3, "c17" for another candidate
    nodes = [replace(n, hover=_hover(trace, c, cand[n.key])) if n.key in cand else n
             for n in tree_view(trace, step.tree, step.path, bonus, None, [], step.lookup_nodes).nodes]
    for key, i in cand.items():
        if key[0] == "c":
            nodes.append(TreeNode(key, candidate_key(c, int(c.parent[i])), int(c.token[i]),
                                  token_text(trace, int(c.token[i])), int(c.level[i]) + 1, NOT_EXTENDED,
                                  _hover(trace, c, i), order=1e6 - float(c.score[i])))
    for depth, members in rest.items():
        if members:
            extended = sum(c.beam[i] == EXPANDED for i in members)
            nodes.append(TreeNode(f"m{depth}", None, -1, "", depth, PRUNED_MORE,
                                  f"{len(members)} more candidates at depth {depth}, not drawn: {extended} extended "
                                  f"by the beam, best score {c.score[members[0]]:.2f}", float(depth),
                                  label=f"+{len(members)} more"))
    return nodes, cand, rest


def _guesses(trace: Trace, step: StepRecord) -> list[TreeNode]:
    """The head's rows: per depth its best PER_LEVEL tokens, best first (`order`: the rank), labelled with their
    draft probability."""
    out = []
    for r, (tokens, probs) in enumerate(zip(step.rows_tokens, step.rows_probs)):
        for j, (tok, p) in enumerate(zip(tokens[:PER_LEVEL].tolist(), probs[:PER_LEVEL].tolist())):
            text = token_text(trace, tok)
            out.append(TreeNode(f"g{r}.{j}", None, tok, text, r + 1, GUESS,
                                f"<b>{token_label(text, 30)}</b>: the head's guess no. {j + 1} for depth {r + 1}, "
                                f"draft p {p:.3f}", order=float(j), label=f"{token_label(text, 10)} {p:.0%}"))
    return out


def _budget_cut(c: Candidates, level: int, budget: int) -> np.ndarray:
    """The best `budget` candidates of levels up to `level`, ranked as the search ranks its pool: the tree if the
    search had stopped there."""
    pool = np.flatnonzero(c.level <= level)
    return pool[np.lexsort((c.level[pool], -c.score[pool]))][:budget]


def _bonus(step: StepRecord) -> int | None:
    """The target's own token after the accepted path; None where the run stopped before it."""
    return step.new_tokens[-1] if len(step.new_tokens) == step.accepted + 1 else None


def _quote(trace: Trace, tokens) -> str:
    return ", ".join(f"“{token_label(token_text(trace, t), 20)}”" for t in tokens)


def step_animation(trace: Trace, index: int, speed: float = 1.0) -> go.Figure:
    """Step `index` of a DART trace, frame by frame: "rows", "level 1" ... (one per search level), "tree",
    "verify", "accepted"."""
    if not 0 <= index < len(trace.steps):
        return _message(f"no step {index} in this trace")
    step = trace.steps[index]
    c = step.candidates
    if step.tree is None:
        return _message(f"Step {index} is the prefill: the target reads the prompt and picks the first token itself; "
                        f"there is no draft tree to animate.")
    if c is None or not len(c) or step.rows_tokens is None or step.rows_probs is None:
        return _message(f"Step {index} built no tree by DART's search (plain decoding, prompt lookup, or a step "
                        f"the automatic budget left to plain decoding): nothing to animate here.")
    bonus = _bonus(step)
    nodes, cand, rest = _step_nodes(trace, step, bonus)
    guesses = _guesses(trace, step)
    pos = tree_layout(nodes)
    pos.update({g.key: (float(g.depth), -g.order) for g in guesses})   # a column per depth, best at the top
    by_key = {n.key: n for n in nodes}

    def show(cats: dict[str, str]) -> list[TreeNode]:
        return [replace(by_key[k], category=cat) for k, cat in cats.items()]

    root = {"n0": ROOT}
    R, k = step.rows_tokens.shape
    frames = [_frame("rows", [by_key["n0"], *guesses], pos,
                     f"The draft head read the context once and guessed the next {R} positions at once: for each "
                     f"depth (a column) its top {k} tokens, best first"
                     + (f" (the best {PER_LEVEL} shown)" if k > PER_LEVEL else "")
                     + ". Everything DART drafts comes from these rows; the search only combines them into paths.")]
    budget = int((c.node > 0).sum())   # the node budget where it bound; else the whole pool, all kept
    levels = np.unique(c.level).tolist()
    for level in levels:
        cats = dict(root)
        cats.update({key: EXTENDED if c.beam[i] == EXPANDED else NOT_EXTENDED
                     for key, i in cand.items() if c.level[i] <= level})
        cats.update({f"m{d}": PRUNED_MORE for d in rest if d <= level + 1 and f"m{d}" in by_key})
        cut = set(_budget_cut(c, level, budget).tolist())
        ring = [key for key, i in cand.items() if i in cut and key in cats]
        here = np.flatnonzero(c.level == level)
        extended = int((c.beam[here] == EXPANDED).sum())
        pool = int((c.level <= level).sum())
        which = "the root is" if level == 0 else \
            f"each of the {int(((c.level == level - 1) & (c.beam == EXPANDED)).sum())} paths the beam kept is"
        words = (f"Search level {level + 1}: {which} extended by the head's guesses for depth {level + 1}: "
                 f"{len(here)} candidates, each scored by its path's draft and n-gram probabilities. ")
        words += (f"The beam keeps the best {extended} to extend at the next level. " if extended else
                  "This is the last level: nothing is extended further. ")
        words += (f"Ringed: the best {min(budget, pool)} of the {pool} candidates so far, the node budget's cut: "
                  f"the tree if the search stopped here.")
        frames.append(_frame(f"level {level + 1}", show(cats), pos, words, ring))

    tree_keys = [f"n{n}" for n in range(1, len(step.tree))]
    cats = {**root, **dict.fromkeys(tree_keys, DRAFT)}
    cats.update({key: prune_category(str(c.fate[i]), str(c.beam[i])) for key, i in cand.items() if key[0] == "c"})
    cats.update({f"m{d}": PRUNED_MORE for d in rest if f"m{d}" in by_key})
    frames.append(_frame("tree", show(cats), pos,
                         f"The draft tree: the {budget} best-scored of all {len(c)} candidates (the node budget), "
                         f"from any level. A child never outscores its parent, so every kept node's parent is kept "
                         f"too. The rest are pruned: cut by the beam (never extended), below the node budget, or "
                         f"an n-gram never seen."
                         + (f" {len(step.lookup_nodes)} node(s) of the prompt-lookup branch are added."
                            if step.lookup_nodes else "")))

    on_path, checked = set(step.path[1:]), set(step.path)
    verdict = {f"n{n}": ACCEPTED if n in on_path else REJECTED if step.tree.parents[n] in checked else UNREACHED
               for n in range(1, len(step.tree))}
    wanted = step.new_tokens[:step.accepted + 1]
    frames.append(_frame("verify", show({**root, **verdict}), pos,
                         f"Verify: the target reads all {len(step.tree) - 1} draft nodes in one forward pass and, "
                         f"after every node, picks its own next token. From the root down it wanted "
                         f"{_quote(trace, wanted)}: green where a node is the target's choice after its parent, "
                         f"orange where it is not; pale nodes hang under a rejected one and do not count."))

    final = {**root, **{key: ACCEPTED if v == ACCEPTED else REJECTED for key, v in verdict.items()}}
    if bonus is not None:
        final["bonus"] = BONUS
    got = f"{step.accepted} draft token{'s' if step.accepted != 1 else ''}"
    if step.accepted:
        got += " " + _quote(trace, step.new_tokens[:step.accepted])
    tail = (f", then the bonus {_quote(trace, [bonus])}: the target's own choice after the last accepted node, free "
            f"with the same forward" if bonus is not None else " (the run stopped here: no bonus)")
    n = len(step.new_tokens)
    frames.append(_frame("accepted", show(final), pos,
                         f"Accepted: {got}{tail}. The step emitted {n} token{'s' if n != 1 else ''} for one target "
                         f"forward pass (plain decoding: 1)."))
    depth = max(n.depth for n in [*nodes, *guesses])
    return _player(frames, f"Step {index}, frame by frame: press ▶ Play or drag the slider",
                   tree_axes(pos, depth, MARGIN), speed)


# ---------------------------------------------------------------------------------------------- a whole run
def run_animation(trace: Trace, speed: float = 1.0) -> go.Figure:
    """One frame per step of the run: the step's tree with its accepted path and bonus token (the prefill has no
    tree: its frame only says what it chose)."""
    if not trace.steps:
        return _message("no steps yet")
    views = []
    for step in trace.steps:
        nodes = [] if step.tree is None else tree_view(trace, step.tree, step.path, _bonus(step), None, [],
                                                       step.lookup_nodes).nodes
        views.append((nodes, tree_layout(nodes) if nodes else {}))
    # One pair of axes for all frames, so nothing rescales as the run plays.
    every = {(i, key): p for i, (_, pos) in enumerate(views) for key, p in pos.items()} or {0: (0.0, 0.0)}
    depth = max((n.depth for nodes, _ in views for n in nodes), default=1)
    frames = []
    for i, (step, (nodes, pos)) in enumerate(zip(trace.steps, views)):
        emitted = token_label("".join(token_text(trace, t) for t in step.new_tokens), 60)
        if step.tree is None:
            words = f"Step {i}, the prefill: the target read the prompt and chose {emitted} itself."
        else:
            words = (f"Step {i}: {len(step.tree) - 1} draft nodes, {step.accepted} accepted"
                     + (", then the bonus" if _bonus(step) is not None else "")
                     + f": emitted {emitted}.")
        frames.append(_frame(f"step {i}", nodes, pos, words))
    return _player(frames, "The run, step by step: press ▶ Play", tree_axes(every, depth, MARGIN), speed)
