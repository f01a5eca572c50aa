"""The words of DART Lab, defined once: dart_core.metrics computes by these definitions, the app's glossary shows
them as they are, and the command line or the bench can print them."""

from __future__ import annotations

GLOSSARY: dict[str, str] = {
    "τ (tau)": "Mean acceptance length: tokens emitted per target verification step, the bonus token included, i.e. "
               "1 + accepted draft tokens per verify step. The last step may emit fewer when a stop token or the "
               "token limit cuts it; τ counts what was really emitted. The prefill's first token is not counted. "
               "Plain decoding has τ = 1.",
    "acceptance per position": "For each draft depth d: the share of verify steps that accepted at least d draft "
                               "tokens, and the share of the steps that accepted d − 1 which also accepted the d-th "
                               "(the conditional rate).",
    "tokens per forward": "Emitted tokens per target forward pass, the forwards being the verify steps plus one "
                          "prefill per generation, and the prefill's token counted (comparable with a count of "
                          "transformers' forwards, where the prefill may already accept drafts).",
    "node budget": "How many draft nodes, besides the root, a tree may hold: the tree is that many of the search's "
                   "best-scored candidates. The target verifies them all in one forward, so a bigger tree catches "
                   "more but costs more. Automatic: chosen as the run goes for the most tokens per second expected "
                   "on this machine.",
    "beam (width)": "At each depth the search extends only the best beam-width sequences (those not ending the "
                    "text) by the next row's top-k tokens; the others are cut by the beam and never extended.",
    "n-gram term": "ngram_weight × ln p_ngram(token | the tokens before it), at most 0, added to a candidate's score "
                   "(weighted by its depth) so that continuations the n-gram table has seen rank higher. A "
                   "continuation it never saw costs ngram_weight × ln eps; a candidate pruned only by that cost is an "
                   "unseen n-gram. The first depth is scored by the draft alone.",
    "lookup branch": "Prompt lookup's copied continuation (what followed the latest earlier occurrence of the "
                     "text's last few tokens) added to every DART tree as one more branch, sharing the nodes DART "
                     "already drafted. Beyond the paper; it pays where the output repeats the prompt, as code does.",
    "bonus token": "The target's own token after the accepted path: the verify forward gives it for free, so every "
                   "step emits the accepted drafts plus one.",
    "draft head row": "One of the draft head's output rows: row d holds its top-k guesses, with their probabilities, "
                      "for the token d positions past the root, all made in one forward of the one-layer head.",
    "speedup": "Tokens per second over a baseline's on the same machine: in the app, a lane's over plain "
               "decoding's in the same run (each lane timed on its own steps only); in the bench, over "
               "transformers' generate in the same dtype.",
}
