"""Traces for the app tests, built without a tokenizer or a browser.

- `hand_trace()`: a tiny DART trace written out by hand, so tests can assert exact nodes, colours and fates.
- `tiny_traces()`: real runs of the tiny random target (plain, DART with an oracle drafter and an n-gram table,
  prompt lookup), with a fake id -> text map that includes HTML and code characters.
- `tiny_engine()`: the app's engine around the tiny target; `run_request()`: a run's settings as the page sends them;
  `EVERY_STEP`: a pace that sends an update after every step, with its tree.
"""

from __future__ import annotations

import functools

import numpy as np

from app.pacing import Pace
from dart_core.acceptance import SamplingConfig
from dart_core.decoding import GenerationConfig, run
from dart_core.ngram import NGramModel
from dart_core.proposers import DartProposer, PromptLookupProposer, VanillaProposer
from dart_core.setup.loading import Loaded
from dart_core.trace import RunSettings, StepRecord, Trace
from dart_core.tree_search import SearchConfig, search

# Token texts with characters that must be escaped or kept (markup, quotes, newline, indentation).
TRICKY = {5: '"q"', 6: "a&b", 7: "\n    ", 8: "<b>bold</b>", 9: "<script>x</script>"}


def token_names(vocab: int = 96) -> dict[int, str]:
    names = {i: f" w{i}" for i in range(vocab)}
    names.update(TRICKY)
    return names


def hand_trace() -> Trace:
    """Prompt [10, 11, 12]; prefill emits 20; step 1 searches rows over a 3-row draft and accepts 2 + bonus.

    The rows: depth 1 = [21, 8, 22], depth 2 = [23, 24, 25], depth 3 = [26, 27, 28] (token 8 is "<b>bold</b>").
    The target's output is 20, 21, 23, 30 (bonus 30 after accepting 21, 23).
    """
    rows_tokens = np.asarray([[21, 8, 22], [23, 24, 25], [26, 27, 28]], dtype=np.int64)
    rows_probs = np.asarray([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.5, 0.3, 0.2]])
    context = [10, 11, 12, 20]
    ngram = NGramModel.build([[12, 20, 21, 23, 26], [20, 21, 24]], vocab_size=96, order=3)
    cfg = SearchConfig(topk=3, beam_width=2, node_budget=5, ngram_weight=0.5)
    result = search(rows_tokens, rows_probs, context, cfg, ngram, eos_ids={2})
    tree = result.tree
    # Accept along 21 -> 23 if both are in the tree.
    path = [0]
    for want in (21, 23):
        nxt = next((n for n in tree.children(path[-1]) if tree.tokens[n] == want), None)
        if nxt is None:
            break
        path.append(nxt)
    accepted = len(path) - 1
    new = [tree.tokens[n] for n in path[1:]] + [30]
    steps = [
        StepRecord(index=0, kind="prefill", context_len=0, new_tokens=[20], timings={"prefill": 0.05}, elapsed=0.05),
        StepRecord(index=1, kind="verify", context_len=3, new_tokens=new, accepted=accepted, tree=tree, path=path,
                   rows_tokens=rows_tokens, rows_probs=rows_probs, candidates=result.candidates,
                   timings={"draft": 0.01, "search": 0.002, "verify": 0.03, "accept": 0.001}, elapsed=0.1,
                   stop_reason="max_new_tokens"),
    ]
    settings = RunSettings(model="hand", sampling=SamplingConfig(), search=cfg, stop_ids=[2])
    return Trace("dart", [10, 11, 12], steps, "hand <prompt>", settings, token_names())


def hand_ngram() -> NGramModel:
    return NGramModel.build([[12, 20, 21, 23, 26], [20, 21, 24]], vocab_size=96, order=3)


@functools.lru_cache(maxsize=1)
def _tiny():
    from dart_core.setup.tiny_models import OracleDrafter, tiny_target
    target = tiny_target()
    return target, OracleDrafter(target, n_rows=3)


def tiny_traces(max_new_tokens: int = 16) -> dict[str, Trace]:
    """Greedy runs of the tiny target: 'vanilla', 'dart' (oracle drafter: long accepted paths) and 'pld'."""
    target, oracle = _tiny()
    prompt = [1, 5, 6, 7, 8, 9, 5, 6, 7, 8]
    ngram = NGramModel.build([list(range(3, 90)), [5, 6, 7, 8, 9] * 4], vocab_size=target.vocab_size, order=3)
    cfg = SearchConfig(topk=6, beam_width=4, node_budget=10)
    sampling = SamplingConfig()
    out = {}
    for name, proposer in (("vanilla", VanillaProposer()), ("dart", DartProposer(oracle, cfg, ngram, eos_ids={2})),
                           ("pld", PromptLookupProposer())):
        trace = run(target, proposer, prompt, GenerationConfig(max_new_tokens, sampling, stop_ids=frozenset({2})),
                    settings=RunSettings(model="tiny", sampling=sampling, search=cfg, stop_ids=[2]))
        trace.method = name
        trace.prompt_text = "tiny"
        trace.token_text = token_names(target.vocab_size)
        out[name] = trace
    return out


class CharTokenizer:
    """Just enough of a tokenizer for the app on the tiny target: one token per character, fixed token texts."""
    chat_template = None
    eos_token_id = 2

    def __init__(self, vocab: int = 96):
        self.names = token_names(vocab)
        self.vocab = vocab

    def __call__(self, text):
        return {"input_ids": [1] + [3 + ord(ch) % (self.vocab - 3) for ch in text]}

    def batch_decode(self, seqs, **kw):
        return ["".join(self.names[int(t)] for t in seq) for seq in seqs]

    def decode(self, seq, **kw):
        return "".join(self.names[int(t)] for t in seq)

    def get_vocab(self):
        return {}


def tiny_engine(ngram: bool = True):
    """An app Engine around the tiny target (random DART head, the tiny n-gram table), able to generate."""
    from app.engine import Engine
    from dart_core.setup.tiny_models import random_head, tiny_target
    target = tiny_target()
    target.tokenizer = CharTokenizer(target.vocab_size)
    return Engine(Loaded(target, random_head(target), tiny_ngram() if ngram else None, "tiny", "random",
                         "tiny" if ngram else "none", "cpu", "fp32"))


EVERY_STEP = Pace(frame_s=0, tree_s=0, chart_s=0.5, busy_share=1)   # an update for every step, with its tree

# The page's settings for a short DART run on the tiny target: a run request is these, with any of them changed.
RUN_DEFAULTS = dict(use_pld=False, temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=12, seed=0, node_budget=12,
                    beam_width=4, topk=6, ngram_weight=0.5, level_exponent=0.7, logit_decay=0.9)


def run_request(prompt="abc", **over):
    from app.request import RunRequest
    return RunRequest.named(prompt, **dict(RUN_DEFAULTS, **over))


def tiny_ngram() -> NGramModel:
    target, _ = _tiny()
    return NGramModel.build([list(range(3, 90)), [5, 6, 7, 8, 9] * 4], vocab_size=target.vocab_size, order=3)


def big_search_trace() -> Trace:
    """One step searched at the default knobs over random rows: about 2,000 candidates, 60 kept."""
    rng = np.random.default_rng(1)
    R, k, vocab = 5, 25, 400
    probs = np.sort(rng.dirichlet(np.full(k, 0.3), size=R), axis=1)[:, ::-1]
    tokens = np.stack([rng.choice(vocab, k, replace=False) for _ in range(R)])
    ngram = NGramModel.build([rng.integers(0, vocab, 3000).tolist()], vocab_size=vocab, order=3)
    result = search(tokens, probs, [1, 2, 3], SearchConfig(), ngram)
    tree = result.tree
    path = [0, tree.children(0)[0]]
    step = StepRecord(index=1, kind="verify", context_len=3, new_tokens=[tree.tokens[path[1]], 7], accepted=1,
                      tree=tree, path=path, rows_tokens=tokens, rows_probs=probs, candidates=result.candidates)
    prefill = StepRecord(index=0, kind="prefill", context_len=0, new_tokens=[3])
    return Trace("dart", [1, 2], [prefill, step])
