"""The story of one step in plain sentences, from the trace alone (no model): what the head guessed, what the search
kept and why, what the target wanted, what was accepted, and what the step earned against plain decoding.

Every number comes from the same records the other views read (the candidates' fates for the counts, the draft rows
for the guesses, the step's own tokens for the target's choices), so the story and the views agree.
"""

from __future__ import annotations

import html

from dart_core.trace import PHASES, Trace

from .pruning import fate_counts
from .text_render import token_text

GUESSES_SHOWN = 3   # the head's best guesses named per position


def _q(trace: Trace, token: int) -> str:
    text = token_text(trace, token).replace("\n", "↵")
    return f"“{text}”"


def step_story(trace: Trace, index: int) -> list[str]:
    """A few sentences about step `index` (empty for a step that is not there)."""
    if not 0 <= index < len(trace.steps):
        return []
    step = trace.steps[index]
    if step.kind == "prefill":
        return [f"The target read the prompt ({len(trace.prompt_ids)} tokens) in one forward pass and chose the first "
                f"token itself: {_q(trace, step.new_tokens[0])}."]
    root = step.tree.tokens[0] if step.tree else None
    story = [f"The root is {_q(trace, root)}, the token the target chose at the end of the previous step."]
    if step.rows_tokens is not None and step.rows_probs is not None:
        rows = []
        for r in range(step.rows_tokens.shape[0]):
            top = ", ".join(f"{_q(trace, int(t))} {100 * float(p):.0f}%" for t, p in
                            zip(step.rows_tokens[r, :GUESSES_SHOWN], step.rows_probs[r, :GUESSES_SHOWN]))
            rows.append(f"{r + 1} ahead: {top}")
        story.append("In one forward pass the draft head guessed the next positions at once — " + "; ".join(rows)
                     + ".")
    counts = fate_counts(trace, index)
    if counts:
        total = sum(counts.values())
        cut = [f"{n} by {label}" for label, n in counts.items() if label != "kept" and n]
        story.append(f"The beam search weighed {total} candidate paths and kept {counts.get('kept', 0)} as tree nodes"
                     + (f"; it cut {', '.join(cut)}." if cut else "."))
    elif step.tree is not None and len(step.tree) == 1:
        story.append("No draft tree this step: plain decoding, one token for one forward pass.")
    if step.lookup_nodes:
        story.append(f"Prompt lookup added {len(step.lookup_nodes)} node(s): a continuation copied from earlier in "
                     f"the text.")
    if step.tree is not None:
        nodes = len(step.tree) - 1
        wanted = [_q(trace, t) for t in step.new_tokens]
        if step.accepted:
            story.append(f"The target checked all {nodes} draft nodes in one forward pass. It wanted "
                         f"{', then '.join(wanted[:step.accepted])}: the tree had {'it' if step.accepted == 1 else 'them'}"
                         f", so {step.accepted} draft token{'s were' if step.accepted > 1 else ' was'} accepted.")
        elif nodes:
            story.append(f"The target checked all {nodes} draft nodes in one forward pass, but none of the root's "
                         f"children was the token it wanted.")
        bonus = step.new_tokens[step.accepted] if len(step.new_tokens) > step.accepted else None
        if bonus is not None:
            story.append(f"After that the target's own choice, {_q(trace, bonus)}, is the bonus token: it comes free "
                         f"with the same forward pass" + (" (it was not among the tree's nodes there)." if nodes
                                                          else "."))
    ms = {p: 1000 * step.timings.get(p, 0.0) for p in PHASES}
    n = len(step.new_tokens)
    story.append(f"The step emitted {n} token{'s' if n != 1 else ''} for one target forward pass (plain decoding: "
                 f"1) in {sum(ms.values()):.0f} ms — draft {ms['draft']:.0f}, search {ms['search']:.0f}, verify "
                 f"{ms['verify']:.0f}.")
    return story


def story_html(trace: Trace, index: int) -> str:
    items = "".join(f"<li>{html.escape(s)}</li>" for s in step_story(trace, index))
    return f'<ol class="step-story">{items}</ol>' if items else ""
