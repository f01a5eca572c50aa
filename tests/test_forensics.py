"""Missed-token forensics: each miss's reason agrees with rerunning the search, and what each knob would have
recovered (node budget, lookup branch, n-gram weight, beam width) agrees with the run itself and with replays that
build the trees again."""

from __future__ import annotations

import numpy as np
import pytest

from app.callbacks import Callbacks
from app.engine import Engine
from app.session import Session
from dart_core.decoding import GenerationConfig, run
from dart_core.forensics.misses import BEAM_KNOB, BUDGET, LOOKUP_KNOB, NGRAM, NGRAM_KNOB, NOT_IN_TOPK, budget_effects, \
    lookup_effects, miss_counts, run_misses, search_effects
from dart_core.forensics.what_if import what_if
from dart_core.ngram import NGramModel
from dart_core.proposers import DartProposer, PromptLookupProposer
from dart_core.trace import RunSettings
from dart_core.tree_search import SearchConfig, search
from dart_core.views.figures import forensics_of, misses_figure
from dart_core.setup.tiny_models import NoisyDrafter, tiny_target

CFG = SearchConfig(topk=8, beam_width=4, node_budget=4)


PROMPT = [1, 4, 5, 6, 7, 8, 4, 5, 6, 9, 4, 5]   # repeats, so prompt lookup finds continuations to copy


def blurred_run(lookup_tokens: int | None = None):
    target = tiny_target("llama", seed=9)
    rng = np.random.default_rng(0)
    table = NGramModel.build([rng.integers(3, 96, 400).tolist()], vocab_size=target.vocab_size, order=3)
    lookup = PromptLookupProposer(max_ngram=3, num_tokens=lookup_tokens) if lookup_tokens else None
    dart = DartProposer(NoisyDrafter(target), CFG, table, lookup=lookup)
    trace = run(target, dart, PROMPT, GenerationConfig(max_new_tokens=60),
                settings=RunSettings(search=CFG, lookup_tokens=lookup_tokens))
    return trace, table


@pytest.fixture(scope="module")
def missing():
    """A greedy DART run of a blurred drafter, small budget: it stops short often, for all kinds of reasons."""
    return blurred_run()


@pytest.fixture(scope="module")
def missing_pld():
    """The same with dart_pld's lookup branch of 3 tokens."""
    return blurred_run(lookup_tokens=3)


def replayed_accepted(trace, i, cfg, table, branch) -> tuple[int, int]:
    """Step i's tree built again (the search, then the branch grafted), followed along the target's output."""
    tree = search(trace.steps[i].rows_tokens, trace.steps[i].rows_probs, trace.context_at(i), cfg, table).tree
    tree, _ = tree.with_branch(branch, len(branch))
    future = [t for s in trace.steps[i:] for t in s.new_tokens]
    return len(tree.follow(future)[0]) - 1, len(tree) - 1


def drafted(trace) -> list[int]:
    return [s.index for s in trace.steps if s.rows_tokens is not None]


def test_every_step_that_stopped_short_has_a_reason(missing):
    trace, _ = missing
    misses = {m.step: m for m in run_misses(trace)}
    short = [i for i, s in enumerate(trace.steps) if s.kind == "verify" and len(s.new_tokens) > s.accepted]
    assert set(misses) == set(short)
    for m in misses.values():
        step = trace.steps[m.step]
        assert m.token == step.new_tokens[step.accepted] and m.depth == step.accepted + 1
        in_row = m.token in step.rows_tokens[m.depth - 1].tolist()
        assert in_row == (m.reason != NOT_IN_TOPK)
    assert sum(miss_counts(list(misses.values())).values()) == len(misses) and len(miss_counts(run_misses(trace))) >= 2


def test_a_budget_miss_is_caught_by_the_budget_it_names(missing):
    trace, table = missing
    budget_misses = [m for m in run_misses(trace) if m.reason in (BUDGET, NGRAM)]
    assert budget_misses
    for m in budget_misses:
        bigger = what_if(trace, m.step, SearchConfig(topk=8, beam_width=4, node_budget=m.rank + 1), table)
        assert bigger.accepted >= m.depth                                    # the wanted token is now accepted
        if m.rank >= 1:
            smaller = what_if(trace, m.step, SearchConfig(topk=8, beam_width=4, node_budget=m.rank), table)
            assert smaller.accepted < m.depth                                # and one node less misses it again
        assert "would have caught it" in m.text()


def test_budget_effects_agree_with_the_run_and_with_what_if(missing):
    trace, table = missing
    effects = {e.value: e for e in budget_effects(trace, budgets=(2, 4, 9))}
    assert effects[4].extra_tokens == 0 and effects[4].extra_nodes == pytest.approx(0)   # the run's own budget
    for b in (2, 9):
        replayed = sum(what_if(trace, i, SearchConfig(topk=8, beam_width=4, node_budget=b), table).accepted
                       for i in drafted(trace))
        assert effects[b].extra_tokens == replayed - sum(trace.steps[i].accepted for i in drafted(trace))
    assert effects[9].extra_tokens >= 0 >= effects[2].extra_tokens


def test_the_lookup_branch_a_dart_run_lacked(missing):
    trace, table = missing
    probe = PromptLookupProposer(max_ngram=3, num_tokens=5)
    misses = run_misses(trace, probe)
    for m in misses:   # flagged exactly where the branch, looked up from the step's context, holds the wanted path
        want = trace.steps[m.step].new_tokens[:m.depth]
        assert m.lookup == (probe.lookup(trace.context_at(m.step))[:m.depth] == want)
    assert any(m.lookup for m in misses) and not all(m.lookup for m in misses)
    assert any("lookup branch (dart_pld) would have offered it" in m.text() for m in misses)
    effects = {e.value: e for e in lookup_effects(trace, max_ngram=3, lengths=(0, 5, 8))}
    assert 0 not in effects                                          # the run's own: no branch
    own = sum(trace.steps[i].accepted for i in drafted(trace))
    for n in (5, 8):
        again = [replayed_accepted(trace, i, CFG, table, PromptLookupProposer(3, n).lookup(trace.context_at(i)))
                 for i in drafted(trace)]
        assert effects[n].extra_tokens == sum(a for a, _ in again) - own > 0
        nodes = sum(k for _, k in again) - sum(len(trace.steps[i].tree) - 1 for i in drafted(trace))
        assert effects[n].extra_nodes == pytest.approx(nodes / len(drafted(trace)))
    assert effects[n].label == "lookup branch 8"


def test_a_dart_pld_run_replays_its_own_branch(missing_pld):
    trace, table = missing_pld
    probe = PromptLookupProposer(max_ngram=3, num_tokens=3)
    assert not any(m.lookup for m in run_misses(trace, probe))      # its own branch was in every tree already
    own = {e.value: e for e in budget_effects(trace, budgets=(CFG.node_budget,), lookup=probe)}
    assert own[CFG.node_budget].extra_tokens == 0 and own[CFG.node_budget].extra_nodes == pytest.approx(0)
    effects = {e.value: e for e in lookup_effects(trace, max_ngram=3, lengths=(0, 3, 10))}
    assert set(effects) == {0, 10} and effects[0].label == "no lookup branch"
    for n in (0, 10):
        again = sum(replayed_accepted(trace, i, CFG, table, PromptLookupProposer(3, n).lookup(trace.context_at(i))
                                      if n else [])[0] for i in drafted(trace))
        assert effects[n].extra_tokens == again - sum(trace.steps[i].accepted for i in drafted(trace))
    assert effects[0].extra_tokens < 0                               # the branch earned tokens in this run


def test_ngram_weight_and_beam_width_replays_agree_with_what_if(missing):
    trace, table = missing
    effects = {(e.knob, e.value): e for e in search_effects(trace, table)}
    assert (NGRAM_KNOB, CFG.ngram_weight) not in effects and (BEAM_KNOB, CFG.beam_width) not in effects
    own = sum(trace.steps[i].accepted for i in drafted(trace))
    for knob, value in [(NGRAM_KNOB, 0.0), (NGRAM_KNOB, 1.0), (BEAM_KNOB, 10), (BEAM_KNOB, 40)]:
        cfg = SearchConfig(**{**CFG.to_dict(), knob: value})
        again = sum(what_if(trace, i, cfg, table).accepted for i in drafted(trace))
        assert effects[knob, value].extra_tokens == again - own
    assert any(e.extra_tokens for e in effects.values())           # the knobs matter in this run
    assert effects[BEAM_KNOB, 10].text().startswith("beam width 10: ")


def test_without_the_table_the_search_replays_are_left_out_with_a_note(missing):
    trace, table = missing
    found = forensics_of(trace, None)
    assert {e.knob for e in found.knobs} == {LOOKUP_KNOB}
    assert any("n-gram table is not loaded" in n for n in found.notes)
    assert {e.knob for e in forensics_of(trace, table).knobs} == {LOOKUP_KNOB, NGRAM_KNOB, BEAM_KNOB}
    assert {e.knob for e in forensics_of(trace, table, replay=False).knobs} == {LOOKUP_KNOB}


def test_the_app_marks_each_miss_and_charts_them(missing, tmp_path):
    trace, table = missing
    trace.token_text = {t: f" w{t}" for t in trace.mentioned_tokens()}
    trace.save(tmp_path / "t.json.gz")
    cb = Callbacks(Engine.replay_only(None), tmp_path / "out")
    cb.engine.replay_ngram = table
    session = Session()
    cb.upload(session, [str(tmp_path / "t.json.gz")])
    first = run_misses(trace)[0]
    info = cb.step_view(session, "dart", first.step)["step_info"]
    assert f"missed: wanted “ w{first.token}” at depth {first.depth}" in info
    fig = cb.charts(session, "dart")["chart_missed"]
    bars = {(t.xaxis or "x", t.marker.color): t for t in fig.data if t.type == "bar"}
    misses = run_misses(trace, PromptLookupProposer(3, 5))
    assert sum(bars["x", "#ef6c00"].x) == len(misses)                                # one count per missed step
    assert sum(bars["x", "#90a4ae"].x) == sum(m.lookup for m in misses) + sum(m.elsewhere for m in misses)
    assert [int(b) for b in bars["x2", "#2e7d32"].x] == [e.value for e in budget_effects(trace)]
    found = forensics_of(trace, table)
    assert list(bars["x3", "#1565c0"].x) == [e.label for e in found.knobs]          # replayed: the lane is done
    assert list(bars["x3", "#1565c0"].y) == [e.extra_tokens for e in found.knobs]
    assert misses_figure(trace, table).to_dict()["data"] == fig.to_dict()["data"]
