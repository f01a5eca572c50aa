"""The step story: plain sentences whose every number matches the other views of the same step."""

from __future__ import annotations

from dart_core.views.pruning import fate_counts
from dart_core.views.story import step_story, story_html
from tests.app_fixtures import hand_trace, tiny_traces


def test_the_hand_step_is_told_with_the_views_numbers():
    trace = hand_trace()
    story = step_story(trace, 1)
    step = trace.steps[1]
    text = " ".join(story)
    assert "The root is “ w20”" in story[0]
    assert "1 ahead: “ w21” 70%, “<b>bold</b>” 20%, “ w22” 10%" in text           # the head's rows, best first
    counts = fate_counts(trace, 1)
    assert f"weighed {sum(counts.values())} candidate paths and kept {counts['kept']} as tree nodes" in text
    assert f"checked all {len(step.tree) - 1} draft nodes" in text
    assert "It wanted “ w21”, then “ w23”" in text and "2 draft tokens were accepted" in text
    assert "“ w30”, is the bonus token" in text
    assert "emitted 3 tokens for one target forward pass" in text and "verify 30" in text
    html = story_html(trace, 1)
    assert "<b>bold</b>" not in html and "&lt;b&gt;bold&lt;/b&gt;" in html              # token text is escaped


def test_prefill_plain_and_lookup_steps():
    traces = tiny_traces()
    assert "read the prompt (10 tokens)" in step_story(traces["dart"], 0)[0]
    plain = " ".join(step_story(traces["vanilla"], 1))
    assert "No draft tree this step" in plain and "emitted 1 token for one" in plain
    assert step_story(traces["dart"], 99) == [] and story_html(traces["dart"], 99) == ""
    accepted = [s for s in traces["dart"].steps[1:] if s.accepted]
    assert accepted and all(f"{s.accepted} draft token" in " ".join(step_story(traces["dart"], s.index))
                            for s in accepted)
