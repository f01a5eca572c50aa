"""The step animation and the run autoplay (dart_core.views.animation): frames, what each frame highlights, the
player's controls, and the one-frame figures of steps with nothing to animate."""

from __future__ import annotations

import numpy as np

from dart_core.trace import Trace
from dart_core.tree_search import EXPANDED
from dart_core.views import animation
from dart_core.views.animation import (DRAFT, EXTENDED, FRAME_MS, GUESS, NOT_EXTENDED, PER_LEVEL, RING, STYLES,
                                       run_animation, step_animation)
from dart_core.views.figures import ACCEPTED, BONUS, COLORS, REJECTED, ROOT
from dart_core.views.text_render import token_label, token_text








def frame(fig, name):
    return next(f for f in fig.frames if f.name == name)


def keys(fr, category) -> list[str]:
    """The node keys a frame draws in a category."""
    return list(next(t for t in fr.data if t.name == STYLES[category][0]).customdata)


def candidate(c, key: str) -> int:
    """The candidate index behind a node key: "c17" is candidate 17, "n3" the candidate kept as tree node 3."""
    return int(key[1:]) if key[0] == "c" else int(np.flatnonzero(c.node == int(key[1:]))[0])


def test_frames_in_order_one_per_search_level(hand, tiny):
    fig = step_animation(hand, 1)
    assert [f.name for f in fig.frames] == ["rows", "level 1", "level 2", "level 3", "tree", "verify", "accepted"]
    dart = tiny["dart"]
    for i, step in enumerate(dart.steps[1:], start=1):
        levels = np.unique(step.candidates.level).tolist()
        assert [f.name for f in step_animation(dart, i).frames] == \
            ["rows", *(f"level {lv + 1}" for lv in levels), "tree", "verify", "accepted"]


def test_every_frame_holds_the_same_traces_and_a_caption(big):
    fig = step_animation(big, 1)
    names = [t.name for t in fig.data]
    for fr in fig.frames:
        assert [t.name for t in fr.data] == names      # plotly animates trace i into trace i
        assert fr.layout.annotations and fr.layout.annotations[0].text
    assert "search level 2" in frame(fig, "level 2").layout.annotations[0].text.lower()


def test_rows_frame_shows_the_heads_rows(hand):
    step = hand.steps[1]
    fr = frame(step_animation(hand, 1), "rows")
    guesses = next(t for t in fr.data if t.name == STYLES[GUESS][0])
    assert len(guesses.x) == step.rows_tokens.size                       # 3 x 3: all fit
    assert guesses.text[0] == f"{token_label(token_text(hand, 21), 10)} 70%"
    assert any("&lt;b&gt;bold" in s for s in guesses.text) and not any("<b>bold" in s for s in guesses.text)
    assert keys(fr, ROOT) == ["n0"]


def test_level_frames_highlight_what_the_beam_extended(hand, big):
    for trace in (hand, big):
        c = trace.steps[1].candidates
        fig = step_animation(trace, 1)
        for level in np.unique(c.level).tolist():
            fr = frame(fig, f"level {level + 1}")
            lit = {candidate(c, k) for k in keys(fr, EXTENDED)}
            faded = {candidate(c, k) for k in keys(fr, NOT_EXTENDED)}
            assert all(c.level[i] <= level for i in lit | faded)            # nothing from a later level yet
            here = set(np.flatnonzero((c.level == level) & (c.beam == EXPANDED)).tolist())
            if trace is hand:   # everything is drawn: exactly what the beam extended
                assert {i for i in lit if c.level[i] == level} == here
            else:               # a big pool: the drawn part of it, and few nodes
                assert lit <= set(np.flatnonzero(c.beam == EXPANDED).tolist()) and (lit & here or not here)
                drawn = [i for i in lit | faded if c.level[i] == level and c.node[i] <= 0]
                assert len(drawn) <= PER_LEVEL
            assert all(c.beam[i] != EXPANDED for i in faded)
    assert set(frame(step_animation(big, 1), "level 1").data[-1].customdata)   # the ring is drawn


def test_the_last_levels_budget_cut_is_the_tree(hand, big):
    for trace in (hand, big):
        step = trace.steps[1]
        fig = step_animation(trace, 1)
        last = [f for f in fig.frames if f.name.startswith("level ")][-1]
        ring = next(t for t in last.data if t.name == RING)
        assert sorted(ring.customdata) == sorted(f"n{n}" for n in range(1, len(step.tree)))
        assert sorted(keys(frame(fig, "tree"), DRAFT)) == sorted(ring.customdata)


def test_verify_frame_colours_follow_the_accepted_path(hand, tiny):
    for trace, i in [(hand, 1), *((tiny["dart"], j) for j in range(1, len(tiny["dart"].steps)))]:
        step = trace.steps[i]
        fr = frame(step_animation(trace, i), "verify")
        green = next(t for t in fr.data if t.name == STYLES[ACCEPTED][0])
        assert green.marker.color == COLORS[ACCEPTED]
        assert sorted(green.customdata) == sorted(f"n{n}" for n in step.path[1:])
        orange = keys(fr, REJECTED)
        assert all(step.tree.parents[int(k[1:])] in step.path for k in orange)


def test_the_last_frame_adds_the_bonus_token(hand):
    step = hand.steps[1]
    fig = step_animation(hand, 1)
    last = fig.frames[-1]
    assert last.name == "accepted"
    bonus = next(t for t in last.data if t.name == STYLES[BONUS][0])
    assert list(bonus.text) == [token_label(token_text(hand, step.new_tokens[-1]))] == ["␣w30"]
    assert "bonus" in last.layout.annotations[0].text and "␣w30" in last.layout.annotations[0].text
    assert not frame(fig, "verify").data[[t.name for t in fig.data].index(STYLES[BONUS][0])].x
    edges = next(t for t in last.data if t.name == "edges: accepted")
    assert len(edges.x) == 3 * step.accepted


def test_play_pause_slider_and_speed(hand):
    fig = step_animation(hand, 1)
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["▶ Play", "❚❚ Pause"] and all(b.method == "animate" for b in buttons)
    assert [s.label for s in fig.layout.sliders[0].steps] == [f.name for f in fig.frames]

    def duration(speed):
        return step_animation(hand, 1, speed).layout.updatemenus[0].buttons[0].args[1]["frame"]["duration"]

    assert duration(1.0) == FRAME_MS and duration(2.0) == FRAME_MS // 2 and duration(0.5) == 2 * FRAME_MS
    assert tuple(animation.SPEEDS) == (0.5, 1.0, 2.0)


def test_steps_with_nothing_to_animate_give_one_frame(hand, tiny):
    cases = {"prefill": (hand, 0), "nothing to animate": (tiny["vanilla"], 1), "no step 9": (hand, 9)}
    for words, (trace, i) in cases.items():
        fig = step_animation(trace, i)
        assert len(fig.frames) == 1 and words in fig.layout.annotations[0].text
        assert not fig.data


def test_run_animation_one_frame_per_step(tiny):
    for lane in ("dart", "vanilla"):
        trace = tiny[lane]
        fig = run_animation(trace, speed=2.0)
        assert [f.name for f in fig.frames] == [f"step {i}" for i in range(len(trace.steps))]
        for step, fr in zip(trace.steps[1:], fig.frames[1:]):
            assert len(keys(fr, ACCEPTED)) == step.accepted
            assert len(keys(fr, BONUS)) == (len(step.new_tokens) == step.accepted + 1)
        assert "prefill" in fig.frames[0].layout.annotations[0].text
        assert fig.layout.updatemenus[0].buttons[0].args[1]["frame"]["duration"] == FRAME_MS // 2
    assert len(run_animation(Trace("dart", [1])).frames) == 1
