"""Who proposes draft tokens. Plain decoding, prompt lookup and DART are three proposers behind one seam.

Each step the decoding loop calls `propose(context, new_features, max_nodes)`:
  context       committed tokens followed by the pending root (the token the target chose last step),
  new_features  target features [S, 3H] of the tokens committed since the previous call (None unless the
                proposer sets `needs_features`),
  max_nodes     how many draft nodes besides the root fit in the context window.
and verifies the returned tree.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from .budget.auto import AutoBudget
from .budget.branch_alone import usable
from .budget.pool import CandidatePool
from .context_ngram import ContextNGram
from . import draft_native
from .draft_fixed import FixedDraft
from .draft_head import DraftCache, DraftHead
from .draft_kernels import int8_copy, int8_supported
from .errors import ConfigError
from .lean_forward import OFF
from .lookup_index import LookupIndex
from .machine.kernels import onednn_applies, packed_linear
from .machine.records import DRAFT_KERNELS, FP32_KERNELS, INT8_KERNELS
from .methods import DART, DART_PLD, PLD, VANILLA
from .ngram import NGramModel
from .budget.step_budget import CurveFix, StepBudget
from .tree import TokenTree
from .tree_search import Candidates, SearchConfig, search


@dataclass
class Proposal:
    tree: TokenTree
    rows_tokens: np.ndarray | None = None   # [R, k] DART's top-k per logit row (target ids)
    rows_probs: np.ndarray | None = None    # [R, k]
    # every candidate the tree search considered, or the function that makes them (StepRecord makes them when read)
    candidates: Candidates | Callable[[], Candidates] | None = None
    lookup_nodes: list[int] | None = None   # tree nodes added by a prompt-lookup branch (DART + lookup)
    search_time: float = 0.0                # seconds of propose() spent in the tree search (the rest is drafting)
    budget: StepBudget | None = None        # DART: the node budget used, and how an automatic one was chosen


class Proposer:
    name = "base"
    needs_features = False

    def reset(self) -> None:
        """Forget per-generation state (called before each prompt)."""

    def propose(self, context: list[int], new_features: torch.Tensor | None, max_nodes: int) -> Proposal:
        raise NotImplementedError

    def observe(self, tokens: int, verify_seconds: float) -> None:
        """The target verified the proposed tree (`tokens` tokens, the root included) in `verify_seconds`."""


class VanillaProposer(Proposer):
    """Plain autoregressive decoding: the tree is the root alone, so each step emits one token."""
    name = VANILLA

    def propose(self, context, new_features, max_nodes):
        return Proposal(TokenTree([context[-1]], [-1]))


class PromptLookupProposer(Proposer):
    """Prompt lookup decoding: copy what followed the latest earlier occurrence of the context's last n-gram."""
    name = PLD

    def __init__(self, max_ngram: int = 3, num_tokens: int = 10, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ConfigError("prompt lookup needs 1 <= min_ngram <= max_ngram")
        if num_tokens < 1:
            raise ConfigError("prompt lookup needs num_tokens >= 1")
        self.max_ngram, self.num_tokens, self.min_ngram = max_ngram, num_tokens, min_ngram
        self.reset()

    def reset(self):
        self.index = LookupIndex(self.min_ngram, self.max_ngram, self.num_tokens)

    def propose(self, context, new_features, max_nodes):
        drafts = self.index.lookup(context)[: max(0, max_nodes)]
        return Proposal(TokenTree.chain(context[-1], drafts))

    def lookup(self, context: list[int]) -> list[int]:
        """The lookup of any one context, by a scan of it (decoding's growing contexts use `index`, the same answer)."""
        ids = np.asarray(context, dtype=np.int64)
        n_ctx = ids.size
        for n in range(min(self.max_ngram, n_ctx - 1), self.min_ngram - 1, -1):
            pattern = ids[n_ctx - n:]
            windows = np.lib.stride_tricks.sliding_window_view(ids[: n_ctx - 1], n)  # excludes the match itself
            hits = np.flatnonzero((windows == pattern).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return ids[start: start + self.num_tokens].tolist()
        return []


class Drafter:
    """Produces DART's K+1 draft logit rows for the next tree."""
    n_rows: int

    def reset(self) -> None: ...

    def draft(self, context: list[int], new_features: torch.Tensor | None) -> torch.Tensor:
        """Logits [R, Vd] for depths 1..R below the root."""
        raise NotImplementedError

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids

    def top_rows(self, logits: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The search's rows from draft logits [R, Vd]: each row's top k as target ids [R, k] (int64), best first,
        and their probabilities renormalised over the k, as the reference does [R, k] (fp32)."""
        top = logits.float().topk(k, dim=-1)
        probs = top.values.softmax(-1)
        tokens = self.target_ids(top.indices)
        # the one host transfer of the step's drafting: ids and probabilities together (ids < 2^24 are exact in fp32)
        both = torch.stack([tokens.to(probs.dtype), probs]).cpu().numpy()
        return both[0].astype(np.int64), both[1]


class HeadDrafter(Drafter):
    """The trained (or random) DART head fed with the target's features and embeddings."""

    def __init__(self, head: DraftHead, target, kernels: str = FP32_KERNELS):
        """kernels: how the head drafts (machine.records.DRAFT_KERNELS: our C layer in bf16, an int8 copy, or torch
        on the head as it is; the set-up code measures which is fastest here). The emitted tokens do not depend on
        it: the target verifies every draft."""
        head.check_target(target)
        self.head = head.to(device=target.device)
        self.target = target
        self.n_rows = head.config.n_rows
        self.out_weight = head.tied_output(target.lm_head.weight)
        self.output, self.native, self.kernels = None, None, kernels
        if kernels in draft_native.WEIGHTS:
            if (why := draft_native.unsupported(head, target.hardware)) is not None:
                raise ConfigError(f"the C layer cannot draft here: {why}")
            self.native = draft_native.packed(head, target.hardware, self.out_weight, draft_native.WEIGHTS[kernels])
        elif kernels == INT8_KERNELS:
            if (why := int8_supported(target.hardware, head)) is not None:
                raise ConfigError(f"an int8 draft head cannot run here: {why}")
            self.head = int8_copy(self.head)
        elif kernels != FP32_KERNELS:
            raise ConfigError(f"unknown draft kernels {kernels!r}; use one of {', '.join(DRAFT_KERNELS)}")
        elif onednn_applies(head.lm_head, target.hardware):
            self.output = packed_linear(head.lm_head, target.hardware)
        # where the target's steps run at fixed shapes (as CUDA graphs on a GPU), the head's do too
        lean = getattr(target, "lean", None)
        graphs = lean.graphs if lean is not None else OFF
        self.fixed = FixedDraft(self.head, self.out_weight, self.output, graphs) \
            if graphs != OFF and kernels == FP32_KERNELS else None
        self.reset()

    def reset(self):
        if self.fixed is not None:
            self.cache = self.fixed.new_cache()
        else:
            self.cache = self.native.new_cache() if self.native is not None else DraftCache()

    @torch.inference_mode()
    def draft(self, context, new_features):
        P, S = self.cache.length, new_features.shape[0]
        if P + S != len(context) - 1:
            raise RuntimeError(f"draft cache out of step: {P} cached + {S} new != {len(context) - 1} committed")
        ids = torch.tensor(context[P + 1:], dtype=torch.long).to(self.target.device, non_blocking=True)   # no wait
        embeds = self.target.embed_tokens(ids)
        if self.native is not None:
            return self.native.step(new_features, embeds, self.cache)
        if self.fixed is not None:
            return self.fixed.step(new_features, embeds, self.cache)[: self.n_rows]
        return self.head(new_features, embeds, self.cache, self.out_weight, self.output)[: self.n_rows]

    def target_ids(self, draft_ids):
        return self.head.target_ids(draft_ids.to(self.head.mask_embed.device))

    def top_rows(self, logits, k):
        if self.native is None:
            return super().top_rows(logits, k)
        ids, probs = self.native.top_rows(logits, k)
        return (ids if self.head.d2t is None else self.head.d2t.numpy()[ids]), probs


class DartProposer(Proposer):
    """DART: draft logit rows from one head forward, pruned into a tree by the n-gram-guided beam search.

    With `lookup` (beyond the reference), prompt lookup's copied continuation joins the tree as one more branch,
    sharing the nodes DART already has: the target verifies both in the same forward. The branch's new nodes come
    on top of the search's node budget."""
    name = DART
    needs_features = True

    def __init__(self, drafter: Drafter, search_config: SearchConfig | None = None,
                 ngram: NGramModel | ContextNGram | None = None, eos_ids=frozenset(),
                 lookup: PromptLookupProposer | None = None, auto_budget: AutoBudget | None = None,
                 record_candidates: bool = True):
        """auto_budget: choose the node budget as the run goes (search_config.node_budget is where it starts);
        record_candidates: each step keeps every candidate the search considered (the trace's and the app's pruning
        record), else its tree alone."""
        self.drafter = drafter
        self.record_candidates = record_candidates
        self.auto_budget = auto_budget
        self._unread: list[torch.Tensor] = []   # features of steps decoded plainly, not yet read by the head
        self.search_config = (search_config or SearchConfig()).validate()
        self.ngram = ngram
        self.eos_ids = frozenset(eos_ids)
        self.lookup = lookup
        if lookup is not None:
            self.name = DART_PLD
        self._curve_event: CurveFix | None = None   # the cost curve's last correction, for the next step's record

    def observe(self, tokens, verify_seconds):
        if self.auto_budget is not None:
            self._curve_event = self.auto_budget.observe_verify(tokens, verify_seconds) or self._curve_event

    def reset(self):
        self.drafter.reset()
        self._unread = []
        if self.lookup is not None:
            self.lookup.reset()
        if self.auto_budget is not None:
            self.auto_budget.reset()
        if hasattr(self.ngram, "reset"):  # a context-adaptive table forgets the previous prompt
            self.ngram.reset()

    def propose(self, context, new_features, max_nodes):
        t0 = time.perf_counter()
        config, budget = self.search_config, None
        ngram, branch = self.lookup.index.matched(context) if self.lookup is not None else (0, [])
        if self.auto_budget is not None:
            auto = self.auto_budget
            chosen = auto.budget_for(context)
            auto.remember_alone(context, ngram, branch)
            length = auto.lookup_tokens if self.lookup is not None and auto.chooses_lookup else None
            if chosen == 0:   # no drafted tree pays here: no draft, no search; the head catches up later
                self._unread.append(new_features)   # joined once, when the head next drafts
                alone = usable(ngram, branch)[:auto.alone_tokens] if length is not None else []
                tree, lookup_nodes = TokenTree([context[-1]], [-1]).with_branch(alone, max(0, max_nodes))
                grafted = len(lookup_nodes) if length is not None else None
                budget = StepBudget(0, True, auto.choice_record, self._curve_event, grafted)
                self._curve_event = None
                return Proposal(tree, lookup_nodes=lookup_nodes or None, budget=budget)
            budget = StepBudget(chosen, True, auto.choice_record, self._curve_event, length)
            self._curve_event = None
            config = replace(config, node_budget=chosen)
        if self._unread:
            new_features, self._unread = torch.cat([*self._unread, new_features]), []
        if hasattr(self.ngram, "observe"):
            self.ngram.observe(context)
        logits = self.drafter.draft(context, new_features)                  # [R, Vd]
        rows_tokens, rows_probs = self.drafter.top_rows(logits, min(config.topk, logits.shape[-1]))
        t1 = time.perf_counter()
        result = search(rows_tokens, rows_probs, context, config, self.ngram, self.eos_ids, node_budget=max_nodes,
                        record=False)   # the record, if kept, made when read (StepRecord.candidates)
        tree, lookup_nodes = result.tree, None
        if self.lookup is not None:   # looked up at the longest: the budget learns every length from it
            used = budget.branch_used(branch) if budget is not None else branch
            tree, lookup_nodes = tree.with_branch(used, max_nodes - (len(tree) - 1))
        t2 = time.perf_counter()
        if self.auto_budget is not None:
            self.auto_budget.remember(context, CandidatePool.of_search(result), branch, t2 - t0)
        return Proposal(tree, rows_tokens, rows_probs, result.recorded if self.record_candidates else None,
                        lookup_nodes, t2 - t1, budget or StepBudget(config.node_budget))
