"""Which step the step view shows (app.step_pick): past the steps that decoded plainly where the user asks, in
following the newest step, on Prev / Next, on picking a lane and at a run's end; a lane without a tree moves as
before."""

from __future__ import annotations

import copy

import pytest

from app import step_pick
from app.callbacks import Callbacks
from app.engine import Engine
from app.lanes import replay_lane
from app.session import Session
from dart_core.tree import TokenTree
from tests.app_fixtures import EVERY_STEP, run_request, tiny_engine, tiny_traces

PLAIN = (2, 3, 5)   # the DART steps made plain below: the root verified alone


@pytest.fixture(scope="module")
def traces():
    out = tiny_traces(max_new_tokens=48)
    dart = copy.deepcopy(out["dart"])
    assert len(dart.steps) >= 6 and all(s.drafted for s in dart.steps[1:])   # the oracle drafts every step
    for i in PLAIN:
        step = dart.steps[i]
        step.tree, step.path, step.accepted = TokenTree([step.tree.tokens[0]], [-1]), [0], 0
        step.new_tokens = step.new_tokens[:1]
    del dart.steps[6:]
    out["dart"] = dart
    return out


def test_newest_and_moves_pass_over_plain_steps(traces):
    dart, vanilla = traces["dart"], traces["vanilla"]
    assert [step_pick.plain_step(s) for s in dart.steps] == [False, False, True, True, False, True]
    assert step_pick.newest(dart, True) == 4 and step_pick.newest(dart, False) == 5
    assert [step_pick.moved(dart, i, -1, True) for i in (5, 4, 1)] == [4, 1, 0]     # the prefill is a step to see
    assert [step_pick.moved(dart, i, +1, True) for i in (0, 1, 4)] == [1, 4, 4]     # none after 4: it stays
    assert step_pick.moved(dart, 1, +1, False) == 2 and step_pick.moved(dart, 5, +1, False) == 6   # clamped later
    # plain decoding's lane has no tree: nothing to skip to, so nothing is skipped
    assert step_pick.newest(vanilla, True) == len(vanilla.steps) - 1
    assert step_pick.moved(vanilla, 3, -1, True) == 2


def test_the_view_skips_plain_steps_until_the_user_says_not_to(traces, tmp_path):
    cb = Callbacks(Engine.replay_only(None), tmp_path)
    session = Session()
    session.lanes = {k: replay_lane(traces[k]) for k in ("vanilla", "dart")}
    assert session.skip_plain                                        # on by default, as the page's box
    assert cb.full_view(session)["step"]["value"] == 4               # a run's end: the newest tree
    assert cb.pick_lane(session, "dart")["step"]["value"] == 4
    assert cb.move_step(session, "dart", 4, -1)["step"]["value"] == 1
    assert cb.move_step(session, "dart", 1, +1)["step"]["value"] == 4
    assert cb.move_step(session, "vanilla", 3, +1)["step"]["value"] == 4
    assert cb.pick_step(session, "dart", 3)["step"]["value"] == 3    # the slider goes anywhere
    session.follow = True
    assert cb.set_skip_plain(session, "dart", False)["step"]["value"] == 5   # following: now the newest step
    assert not session.skip_plain and cb.move_step(session, "dart", 5, -1)["step"]["value"] == 4
    assert cb.set_skip_plain(session, "dart", True) == {}           # not following: the view stays where it is
    assert session.skip_plain


def test_following_a_run_shows_its_newest_tree(traces, tmp_path):
    cb = Callbacks(Engine.replay_only(None), tmp_path)
    session = Session()
    session.lanes = {k: replay_lane(traces[k]) for k in ("vanilla", "dart")}
    view = cb.frame_view(session, ["dart"], "dart", False, tree=True, charts=False)
    assert view["step"]["value"] == 4 and view["tree"].layout.title.text.startswith("Step 4:")
    session.skip_plain = False
    assert cb.frame_view(session, ["dart"], "dart", False, tree=True, charts=False)["step"]["value"] == 5


def test_a_run_draws_a_tree_only_when_the_step_to_show_changes(monkeypatch, tmp_path):
    """While plain steps pass, the newest tree stays the one to show: the run does not send it again."""
    cb = Callbacks(tiny_engine(), tmp_path, pace=EVERY_STEP)
    # with the skip, the step to show stops at 1, as while plain steps pass; without it, the newest
    monkeypatch.setattr(step_pick, "newest", lambda trace, skip: min(len(trace.steps) - 1, 1) if skip else
                        len(trace.steps) - 1)
    for skip in (True, False):
        session = Session()
        session.skip_plain = skip
        updates = list(cb.run(session, run_request("still", max_new_tokens=12)))
        shown = [u["step"]["value"] for u in updates[1:-1] if "tree" in u]   # the run's own (not its first and last)
        n = len(session.lanes["dart"].trace.steps)
        assert shown == ([0, 1] if skip else list(range(n))[: len(shown)]) and (skip or len(shown) >= n - 1)
