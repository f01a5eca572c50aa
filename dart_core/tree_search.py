"""N-gram-guided beam search: turns DART's K+1 independent logit rows into a prefix-closed draft tree.

For each level l (one logit row per level) every beam entry is extended by the row's top-k tokens. A child's score
is its parent's plus  level_weight(l) * (logit_weight(l) * ln p_draft + ngram_weight * ln p_ngram(token | path)).
The beam keeps the best `beam_width` non-EOS sequences; every expansion goes into a pool, and the tree is the top
`node_budget` of the pool. Every term is <= 0, so a child never outranks its parent; ties are broken shallower
first, so the kept set is always prefix-closed (the reference's unstable sort could drop a parent on a tie).

Every candidate considered is recorded with its score parts and its fate, for the trace and the visualizer.

The search runs in C where our kernels are built (machine/tree_search.c: a step's search in well under a millisecond,
where numpy's hundred small operations took two), else in numpy; both record the same columns to the last bit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

import numpy as np

from . import tree_search_native
from .errors import ConfigError
from .machine.hardware import kernels_here
from .ngram import NGramModel
from .tree import TokenTree

# Fate of a candidate in the final tree.
KEPT, NODE_BUDGET, LOW_NGRAM = "kept", "node_budget", "low_ngram"
FATES = (KEPT, NODE_BUDGET, LOW_NGRAM)
# What the beam did with a candidate: extended at the next level, cut by the beam width, not extended because it
# ends in EOS, or at the last level (nothing to extend into).
EXPANDED, BEAM_CUT, EOS_END, LAST_LEVEL = "expanded", "beam_cut", "eos", "last_level"
BEAM_STATES = (EXPANDED, BEAM_CUT, EOS_END, LAST_LEVEL)
_FATE_CODE, _BEAM_CODE = ({name: i for i, name in enumerate(names)} for names in (FATES, BEAM_STATES))
_FATE_NAMES, _BEAM_NAMES = (np.asarray(names, dtype=object) for names in (FATES, BEAM_STATES))


@dataclass(frozen=True)
class Knob:
    """A setting as a user meets it: its label and help, the range the app's slider offers (the engine's own limits
    are `SearchConfig.validate`'s), and its command-line option. The search knobs are made from SearchConfig's field
    metadata (`search_knobs`), the one list the CLI's options, the app's sliders and what-if's inputs come from."""
    name: str
    label: str
    minimum: float
    maximum: float
    default: float
    step: float
    integer: bool = False
    help: str = ""
    flag: str = ""               # the command line's option ("" where it has none)


def _knob(label: str, help: str, span: tuple[float, float, float], flag: str) -> dict:
    """A SearchConfig field's metadata: it is a knob users set; span: the slider's (minimum, maximum, step)."""
    return {"knob": {"label": label, "help": help, "span": span, "flag": flag}}


@dataclass
class SearchConfig:
    """The tree search's knobs, in the order users meet them; each user-facing one says how (its `_knob`)."""
    node_budget: int = field(default=60, metadata=_knob("Node budget", "draft tree nodes besides the root",
                                                        (0, 256, 1), "--node-budget"))
    beam_width: int = field(default=20, metadata=_knob("Beam width", "sequences extended per level", (1, 64, 1),
                                                       "--beam-width"))
    topk: int = field(default=25, metadata=_knob("Top-k per row", "candidates per draft row", (1, 64, 1),
                                                 "--topk-per-row"))
    ngram_weight: float = field(default=0.5, metadata=_knob("N-gram weight", "weight of ln p_ngram in a score",
                                                            (0.0, 2.0, 0.05), "--ngram-weight"))
    level_exponent: float = field(default=0.7, metadata=_knob("Level weight exponent", "level weight = (level+1)^-x",
                                                              (0.0, 2.0, 0.05), "--level-exponent"))
    logit_decay: float = field(default=0.9, metadata=_knob("Logit weight decay", "logit weight = decay^level",
                                                           (0.05, 1.0, 0.05), "--logit-decay"))
    ngram_first_level: bool = False  # the reference scores level 0 by the draft alone
    eps: float = 1e-10            # floor inside the logs: an unseen n-gram costs ngram_weight * ln(eps)

    def validate(self) -> "SearchConfig":
        checks = [
            (self.topk >= 1, f"topk must be >= 1, got {self.topk}"),
            (self.beam_width >= 1, f"beam_width must be >= 1, got {self.beam_width}"),
            (self.node_budget >= 0, f"node_budget must be >= 0, got {self.node_budget}"),
            (self.level_exponent >= 0, f"level_exponent must be >= 0, got {self.level_exponent}"),
            (0 < self.logit_decay <= 1, f"logit_decay must be in (0, 1], got {self.logit_decay}"),
            (self.ngram_weight >= 0, f"ngram_weight must be >= 0, got {self.ngram_weight}"),
            (0 < self.eps < 1, f"eps must be in (0, 1), got {self.eps}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        return self

    def level_weight(self, level: int) -> float:
        return (level + 1) ** -self.level_exponent

    def logit_weight(self, level: int) -> float:
        return self.logit_decay ** level

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "SearchConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def search_knobs(defaults: SearchConfig | None = None) -> tuple[Knob, ...]:
    """The search knobs users set, in SearchConfig's order, with `defaults`' values (SearchConfig()'s by default)."""
    defaults = defaults or SearchConfig()
    knobs = []
    for f in fields(SearchConfig):
        if "knob" in f.metadata:
            meta = f.metadata["knob"]
            minimum, maximum, step = meta["span"]
            knobs.append(Knob(f.name, meta["label"], minimum, maximum, getattr(defaults, f.name), step,
                              integer=isinstance(f.default, int), help=meta["help"], flag=meta["flag"]))
    return tuple(knobs)


@dataclass
class Candidates:
    """Every candidate the search considered, as columns (one entry per candidate)."""
    token: np.ndarray        # int64
    level: np.ndarray        # int32, 0-based (depth in the tree = level + 1)
    parent: np.ndarray       # int32, candidate index of the parent, -1 for the root
    draft_prob: np.ndarray   # float64, softmax over the row's top-k
    logit_term: np.ndarray   # float64, logit_weight * ln(draft_prob)
    ngram_prob: np.ndarray   # float64, backoff n-gram probability (nan when no n-gram term applies)
    ngram_match: np.ndarray  # int8, context length that matched; 0 = unseen; -1 = no n-gram term
    ngram_term: np.ndarray   # float64, ngram_weight * ln(ngram_prob), 0 when no n-gram term
    level_weight: np.ndarray  # float64
    score: np.ndarray        # float64, cumulative path score
    fate: np.ndarray         # str: kept / node_budget / low_ngram
    beam: np.ndarray         # str: expanded / beam_cut / eos / last_level
    node: np.ndarray         # int32, tree node index of a kept candidate, else -1

    def __len__(self) -> int:
        return len(self.token)

    def to_dict(self, digits: int = 6) -> dict:
        out = {}
        for f in fields(self):
            col = getattr(self, f.name)
            if col.dtype.kind == "f":
                out[f.name] = [None if np.isnan(x) else round(float(x), digits) for x in col]
            else:
                out[f.name] = col.tolist()
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "Candidates":
        dtypes = {"token": np.int64, "level": np.int32, "parent": np.int32, "ngram_match": np.int8,
                  "node": np.int32, "fate": object, "beam": object}
        cols = {}
        for f in fields(cls):
            values = data[f.name]
            if f.name in dtypes:
                cols[f.name] = np.asarray(values, dtype=dtypes[f.name])
            else:
                cols[f.name] = np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
        return cls(**cols)


@dataclass
class SearchResult:
    tree: TokenTree
    candidates: Candidates | None   # every candidate with its score parts and fate (None: not recorded)
    kept: np.ndarray  # candidate index of each non-root tree node, in node order (node i+1 = kept[i])
    columns: dict[str, np.ndarray]   # the search's own columns (Candidates' names, raw): what it ranked
    budget: int                      # the node budget the tree was cut to

    def recorded(self) -> Candidates:
        """Every candidate with its score parts and fate, made from the search's columns (what `record` keeps)."""
        return self.candidates if self.candidates is not None else _make_candidates(self.columns, self.kept,
                                                                                     self.budget)


def search(rows_tokens: np.ndarray, rows_probs: np.ndarray, context: list[int], cfg: SearchConfig,
           ngram=None, eos_ids: frozenset[int] | set[int] = frozenset(),
           node_budget: int | None = None, record: bool = True) -> SearchResult:
    """Build the draft tree.

    rows_tokens: [R, k] candidate tokens per logit row (row l gives depth l+1), best first.
    rows_probs:  [R, k] their draft probabilities.
    context:     committed tokens ending with the root (at least the last order-1 are used by the n-gram).
    ngram:       an NGramModel, a ContextNGram (any model with `order` and `lookup`), or None.
    node_budget: overrides cfg.node_budget (e.g. when the context window leaves less room).
    record:      keep every candidate with its score parts and fate (the trace's and the app's pruning record);
                 without it the result's candidates are None (the tree and the ranked columns are the same).
    """
    kernel = kernels_here()
    if kernel is not None and (ngram is None or type(ngram) is NGramModel):
        return _search_in_c(kernel, rows_tokens, rows_probs, context, cfg, ngram, eos_ids, node_budget, record)
    return search_in_numpy(rows_tokens, rows_probs, context, cfg, ngram, eos_ids, node_budget, record)


def _tail(context: list[int], ngram) -> list[int]:
    """The context's last order-1 tokens the n-gram reads, -1 padding a context shorter than that."""
    n_ctx = ngram.order - 1 if ngram is not None else 0
    tail = list(context[-n_ctx:]) if n_ctx else []
    return [-1] * (n_ctx - len(tail)) + tail


def _search_in_c(kernel, rows_tokens, rows_probs, context, cfg, ngram, eos_ids, node_budget, record) -> SearchResult:
    budget = cfg.node_budget if node_budget is None else min(node_budget, cfg.node_budget)
    R, k = rows_tokens.shape
    if budget <= 0 or R == 0:
        return _empty(context, record)
    table, kept = tree_search_native.beam_search(kernel, rows_tokens, rows_probs, min(k, cfg.topk),
                                                 _tail(context, ngram), cfg, eos_ids, ngram, budget)
    return _result(context, table, kept, budget, record)


def _result(context: list[int], table: dict, kept: np.ndarray, budget: int, record: bool) -> SearchResult:
    result = SearchResult(_tree_from_kept(int(context[-1]), table["token"], table["parent"], kept), None, kept, table,
                          budget)
    if record:
        result.candidates = result.recorded()
    return result


def _empty(context: list[int], record: bool = True) -> SearchResult:
    cols = {name: np.zeros(0, dtype=dtype) for name, dtype in tree_search_native.COLUMNS.items()}
    return _result(context, cols, np.zeros(0, dtype=np.int64), 0, record)


def search_in_numpy(rows_tokens: np.ndarray, rows_probs: np.ndarray, context: list[int], cfg: SearchConfig,
                    ngram=None, eos_ids: frozenset[int] | set[int] = frozenset(),
                    node_budget: int | None = None, record: bool = True) -> SearchResult:
    """`search` in numpy: where our kernels are not built, and for a ContextNGram."""
    budget = cfg.node_budget if node_budget is None else min(node_budget, cfg.node_budget)
    R, k = rows_tokens.shape
    k = min(k, cfg.topk)
    tail = _tail(context, ngram)
    n_ctx = len(tail)
    eos = np.asarray(sorted(eos_ids), dtype=np.int64)

    cols: dict[str, list[np.ndarray]] = {name: [] for name in (
        "token", "level", "parent", "draft_prob", "logit_term", "ngram_prob", "ngram_match", "ngram_term",
        "level_weight", "score", "beam")}
    beam_idx = np.asarray([-1])                        # candidate index of each beam entry's last node
    beam_score = np.zeros(1)
    beam_ctx = np.asarray([tail], dtype=np.int64).reshape(1, n_ctx)  # last n_ctx tokens of each beam path
    offset = 0
    levels = R if budget > 0 else 0
    for level in range(levels):
        B = len(beam_idx)
        tok = np.broadcast_to(rows_tokens[level, :k], (B, k))
        prob = np.broadcast_to(rows_probs[level, :k].astype(np.float64), (B, k))
        wlev = cfg.level_weight(level)
        logit_term = log_term(prob, cfg.logit_weight(level), cfg.eps)
        if ngram is not None and cfg.ngram_weight > 0 and (level > 0 or cfg.ngram_first_level):
            q, match = ngram.lookup(beam_ctx, tok)
            ngram_term = log_term(q, cfg.ngram_weight, cfg.eps)
        else:
            q = np.full((B, k), np.nan)
            match = np.full((B, k), -1, dtype=np.int8)
            ngram_term = np.zeros((B, k))
        score = child_score(beam_score[:, None], wlev, logit_term, ngram_term)

        flat_score = score.ravel()
        flat_tok = tok.ravel()
        is_eos = np.tile((rows_tokens[level, :k, None] == eos[None, :]).any(1), B)  # every beam shares the row
        # Next beam: best non-EOS sequences (ties keep the earlier, i.e. higher-ranked parent / token).
        order = np.lexsort((-flat_score, is_eos))
        n_next = min(cfg.beam_width, int((~is_eos).sum())) if level < levels - 1 else 0
        survivors = order[:n_next]
        # as indices into BEAM_STATES while searching (object arrays are slow to fill), named once at the end
        beam_state = np.full(B * k, _BEAM_CODE[BEAM_CUT], dtype=np.int8)
        beam_state[is_eos] = _BEAM_CODE[EOS_END]
        if level == levels - 1:
            beam_state[:] = _BEAM_CODE[LAST_LEVEL]
        beam_state[survivors] = _BEAM_CODE[EXPANDED]

        cols["token"].append(flat_tok)
        cols["level"].append(np.full(B * k, level, dtype=np.int32))
        cols["parent"].append(np.repeat(beam_idx, k).astype(np.int32))
        cols["draft_prob"].append(prob.ravel())
        cols["logit_term"].append(np.broadcast_to(logit_term, (B, k)).ravel())
        cols["ngram_prob"].append(q.ravel())
        cols["ngram_match"].append(match.ravel().astype(np.int8))
        cols["ngram_term"].append(ngram_term.ravel())
        cols["level_weight"].append(np.full(B * k, wlev))
        cols["score"].append(flat_score)
        cols["beam"].append(beam_state)

        parent_row = survivors // k
        if n_ctx:
            beam_ctx = np.concatenate([beam_ctx[parent_row, 1:], flat_tok[survivors, None]], axis=1)
        else:
            beam_ctx = np.zeros((len(survivors), 0), dtype=np.int64)
        beam_idx = offset + survivors
        beam_score = flat_score[survivors]
        offset += B * k
        if n_next == 0:
            break

    if offset == 0:
        return _empty(context, record)

    table = {name: np.concatenate(parts) for name, parts in cols.items()}
    # Top `budget` by score, shallower first on ties: a parent (score >= child's) always precedes its children.
    ranking = np.lexsort((table["level"], -table["score"]))
    kept = ranking[:budget]
    kept = kept[np.lexsort((-table["score"][kept], table["level"][kept]))]  # node order: by depth, then score
    return _result(context, table, kept, budget, record)


def log_term(prob, weight: float, eps: float):
    """A score term: weight · ln(p + eps), never above 0 (the logit term of a draft probability, the n-gram term of
    an n-gram one). Where our kernels are built, by the C library's log, as the C search computes it (numpy's own
    log can differ from it in the last bit)."""
    kernel = kernels_here()
    if kernel is None:
        return np.minimum(weight * np.log(prob + eps), 0.0)
    p = np.ascontiguousarray(prob, dtype=np.float64)
    out = np.empty_like(p)
    kernel.lib.log_terms(p.ctypes.data, p.size, float(weight), float(eps), out.ctypes.data)
    return out


def child_score(parent_score, level_weight, logit_term, ngram_term):
    """A candidate's cumulative score: its parent's plus level_weight · (logit term + n-gram term)."""
    return parent_score + level_weight * (logit_term + ngram_term)


def rescore(cols: dict[str, np.ndarray], ngram_weight: float, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """The n-gram term and the cumulative score of every candidate of a recorded pool, from its other columns (by
    Candidates' names) and the search's knobs, as the search computed them (no n-gram term where none applied,
    ngram_match < 0)."""
    applied = cols["ngram_match"] >= 0
    with np.errstate(invalid="ignore", divide="ignore"):
        term = np.where(applied, log_term(np.nan_to_num(cols["ngram_prob"]), ngram_weight, eps), 0.0)
    score = np.zeros(len(term))
    parent = cols["parent"].astype(np.int64)
    for level in np.unique(cols["level"]):   # parents are one level up: done before their children
        idx = np.flatnonzero(cols["level"] == level)
        base = np.where(parent[idx] >= 0, score[np.maximum(parent[idx], 0)], 0.0)
        score[idx] = child_score(base, cols["level_weight"][idx], cols["logit_term"][idx], term[idx])
    return term, score


def _make_candidates(table: dict, kept: np.ndarray, budget: int) -> Candidates:
    n = len(table["token"])
    node = np.full(n, -1, dtype=np.int32)
    node[kept] = np.arange(1, len(kept) + 1, dtype=np.int32)
    fate = np.full(n, _FATE_CODE[NODE_BUDGET], dtype=np.int8)
    fate[kept] = _FATE_CODE[KEPT]
    if len(kept) and len(kept) == budget:
        # A pruned candidate is "low_ngram" when its parent is in the tree and its score without the n-gram
        # penalty for an unseen continuation would have cleared the cut.
        cutoff = table["score"][kept].min()
        parent = table["parent"].astype(np.int64)
        parent_in_tree = (parent < 0) | (node[np.maximum(parent, 0)] > 0)
        without_ngram = table["score"] - table["level_weight"] * table["ngram_term"]
        low = ((node < 0) & parent_in_tree & (table["ngram_match"] == 0) & (without_ngram >= cutoff))
        fate[low] = _FATE_CODE[LOW_NGRAM]
    # the search's columns in the C search's dtypes (Candidates' own): its arrays as they are where they already fit
    columns = {name: table[name].astype(dtype, copy=False) for name, dtype in tree_search_native.COLUMNS.items()
               if name != "beam"}
    return Candidates(**columns, fate=_FATE_NAMES[fate], beam=_BEAM_NAMES[table["beam"]], node=node)


def _tree_from_kept(root: int, token: np.ndarray, parent: np.ndarray, kept: np.ndarray) -> TokenTree:
    node_of = np.full(len(token) + 1, len(kept) + 1, dtype=np.int64)   # by candidate + 1 (the root's "parent" -1: 0)
    node_of[0] = 0
    node_of[kept + 1] = np.arange(1, len(kept) + 1)
    parents = node_of[parent[kept].astype(np.int64) + 1]
    late = np.flatnonzero(parents > np.arange(len(kept)))   # a parent not kept before its child
    if late.size:  # cannot happen with non-positive terms and depth tie-breaks; guard the invariant
        cand = int(kept[late[0]])
        raise AssertionError(f"tree search kept candidate {cand} without its parent {int(parent[cand])}")
    return TokenTree([root, *token[kept].tolist()], [-1, *parents.tolist()])
