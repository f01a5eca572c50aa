"""Missed-token forensics: each miss's reason agrees with rerunning the search, and the per-budget effects agree
with the run itself and with what-if replays."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.callbacks import Callbacks
from app.engine import Engine
from app.session import Session
from app.whatif import what_if
from dart_core.decoding import GenerationConfig, run
from dart_core.forensics import BUDGET, NGRAM, NOT_IN_TOPK, budget_effects, miss_counts, run_misses
from dart_core.ngram import NGramModel
from dart_core.proposers import DartProposer
from dart_core.trace import RunSettings
from dart_core.tree_search import SearchConfig
from tests.tiny import TargetDrafter, tiny_target

CFG = SearchConfig(topk=8, beam_width=4, node_budget=4)


class NoisyDrafter(TargetDrafter):
    """The target's own rows blurred by seeded noise: the wanted token lands at all sorts of ranks."""

    def __init__(self, target, n_rows=3, noise=4.0):
        super().__init__(target, n_rows)
        self.gen, self.noise = torch.Generator().manual_seed(0), noise

    def draft(self, context, new_features):
        rows = super().draft(context, new_features)
        return rows + self.noise * torch.randn(rows.shape, generator=self.gen)


@pytest.fixture(scope="module")
def missing():
    """A greedy DART run of a blurred drafter, small budget: it stops short often, for all kinds of reasons."""
    target = tiny_target("llama", seed=9)
    rng = np.random.default_rng(0)
    table = NGramModel.build([rng.integers(3, 96, 400).tolist()], vocab_size=target.vocab_size, order=3)
    dart = DartProposer(NoisyDrafter(target), CFG, table)
    trace = run(target, dart, [1, 4, 5, 6, 7, 8], GenerationConfig(max_new_tokens=60),
                settings=RunSettings(search=CFG))
    return trace, table


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
    assert sum(miss_counts(trace).values()) == len(misses) and len(miss_counts(trace)) >= 2


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
    effects = {e.budget: e for e in budget_effects(trace, budgets=(2, 4, 9))}
    assert effects[4].extra_tokens == 0 and effects[4].extra_nodes == pytest.approx(0)   # the run's own budget
    drafted = [s.index for s in trace.steps if s.rows_tokens is not None]
    for b in (2, 9):
        replayed = sum(what_if(trace, i, SearchConfig(topk=8, beam_width=4, node_budget=b), table).accepted
                       for i in drafted)
        assert effects[b].extra_tokens == replayed - sum(trace.steps[i].accepted for i in drafted)
    assert effects[9].extra_tokens >= 0 >= effects[2].extra_tokens


def test_the_app_marks_each_miss_and_charts_them(missing, tmp_path):
    trace, _ = missing
    trace.token_text = {t: f" w{t}" for t in trace.mentioned_tokens()}
    trace.save(tmp_path / "t.json.gz")
    cb = Callbacks(Engine.replay_only(None), tmp_path / "out")
    session = Session()
    cb.upload(session, [str(tmp_path / "t.json.gz")])
    first = run_misses(trace)[0]
    info = cb.step_view(session, "dart", first.step)["step_info"]
    assert f"missed: wanted “ w{first.token}” at depth {first.depth}" in info
    fig = cb.charts(session, "dart")["chart_missed"]
    bars = [t for t in fig.data if t.type == "bar"]
    assert sum(bars[0].x) == len(run_misses(trace))                                  # one count per missed step
    assert [int(b) for b in bars[1].x] == [e.budget for e in budget_effects(trace)]
