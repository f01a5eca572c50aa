"""Training the DART draft head on the target's features and labels, computed as sequences come (see data.py).

Each step takes one sequence, picks up to `anchors` positions in its response, gives each its K mask slots (one
block-masked forward for all of them: `DraftHead.forward_train`, computed only on the rows the loss reads, see
head_forward.py), and scores row r of anchor p against the target's own top-k distribution at position p+1+r
(soft cross-entropy, per-row weights decaying with depth). What a step computes of its sequences: anchors.py;
the loss: loss.py; a new head's vocabulary, output layer and feature statistics: head_setup.py.

Formats: `dartlab` (ours) or `authors` (the DART authors' files, fvliang/DART). Their head applies the final norm
twice, which no weights of a single-norm head reproduce exactly (see head_formats.authors_compatible), so an
`authors` head is trained in their architecture from the first step: the double norm, and per-dimension feature
scales without a mean (folded into fc when written; their fc has no bias for a mean).

Data parallel (torchrun, see distributed.py): each process trains on its own sequences of every step, gradients are
averaged across processes, rank 0 evaluates and writes. Anchors are drawn per sequence from (seed, sequence index),
so N processes with `accumulate` sequences each make the same steps as one process with N x `accumulate`.

Held-out metrics: the training loss on held-out sequences, per-row top-1 agreement with the target's argmax, and two
acceptance estimates: the greedy chain (tau if the tree were the argmax of each row) and a top-3 bound (tau if every
row's top 3 were all in the tree).
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from ..draft_head import DraftConfig, DraftHead
from ..errors import DartError
from ..machine.hardware import detect
from ..formats.head_formats import save_authors
from ..target import TargetModel
from . import distributed
from .anchors import head_logits, row_stats, sequence_batch
from .head_forward import TrainingForward
from .head_setup import choose_draft_vocab, grow_draft_vocab, init_from_target, set_feature_stats, vocab_coverage
from .loss import soft_ce
from .progress import Progress
from .records import AnchorBatch, Evaluation, RowStats, SequenceExample, minutes_trained

FORMATS = ("dartlab", "authors")


class TrainingError(DartError):
    """A run that cannot go on as asked (a checkpoint of another format, a sequence with nothing to train on)."""


@dataclass
class TrainConfig:
    n_mask: int = 5
    draft_vocab: int = 8192          # 0 = the full target vocabulary
    anchors: int = 256               # anchor positions per sequence per step (up to)
    accumulate: int = 2              # sequences per optimizer step
    sequence_batch: int = 1          # of those, sequences per head forward (several fill a GPU; the same gradients)
    lr: float = 1e-3
    weight_decay: float = 0.01
    row_decay: float = 0.8           # loss weight of row r: row_decay ** r
    warmup: int = 100
    max_steps: int = 10_000          # optimizer steps (the schedule length)
    minutes: float = 0.0             # stop after this long (0 = no limit); the schedule still uses max_steps
    schedule: str = "steps"          # "time": the cosine also runs out with `minutes` (a device of unknown speed)
    decay_steps: int = 0             # > 0: warmup-stable-decay, the rate held until the last decay_steps steps
    eval_every: int = 200
    checkpoint_minutes: float = 10.0  # also checkpoint between evaluations this often (a killed run loses less)
    seed: int = 0
    bf16: bool = True                # autocast the head's matmuls to bf16 where the device computes bf16 natively
    head_format: str = "dartlab"     # "authors": their architecture (double norm, feature scales without a mean)


def native_bf16(device: torch.device) -> bool:
    """bf16 matmuls in hardware: a GPU, or a CPU whose oneDNN has a bf16 path (AVX-512 BF16 / AMX). An AVX2 CPU
    has none, so there the head trains in fp32."""
    return device.type != "cpu" or detect().onednn_bf16


class Trainer:
    def __init__(self, target: TargetModel, stats_seqs: list[SequenceExample], heldout: list[SequenceExample],
                 cfg: TrainConfig,
                 out_dir, stop_ids=(), corpus_counts: torch.Tensor | None = None, start_head: DraftHead | None = None,
                 provenance: dict | None = None):
        """stats_seqs: sequences used to choose the draft vocabulary and the feature statistics;
        heldout: sequences never trained on, for the metrics (needed by rank 0 only);
        start_head: a trained head to continue from (its K, vocabulary and feature statistics), else a new one;
        provenance: what metrics.json records of the run beside the trainer's own (target, data, ...)."""
        if cfg.head_format not in FORMATS:
            raise TrainingError(f"unknown head format {cfg.head_format!r}; use one of {', '.join(FORMATS)}")
        if start_head is not None:  # K and the draft vocabulary are the starting head's
            cfg = replace(cfg, n_mask=start_head.config.n_mask, draft_vocab=start_head.config.draft_vocab_size or 0)
        self.target, self.cfg, self.out = target, cfg, Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.heldout, self.provenance = heldout, dict(provenance or {})
        vocab = target.vocab_size

        def choose(must_include=()):
            return choose_draft_vocab(stats_seqs, cfg.draft_vocab, [*stop_ids, *must_include], corpus_counts)

        self._choose_vocab = choose
        torch.manual_seed(cfg.seed)
        if start_head is not None:
            # its provenance is kept: its own training time counts toward this head's
            self.head, self.started_from = start_head, dict(start_head.config.extra)
        else:
            self.started_from = None
            d2t = choose() if cfg.draft_vocab and cfg.draft_vocab < vocab else None
            authors = cfg.head_format == "authors"
            dcfg = DraftConfig.for_target(target.config, n_mask=cfg.n_mask, tie_output=False,
                                          draft_vocab_size=None if d2t is None else len(d2t),
                                          standardize_features=True, double_norm=authors)
            self.head = DraftHead(dcfg)
            if d2t is not None:
                self.head.d2t.copy_(d2t)
            init_from_target(self.head, target)
            set_feature_stats(self.head, stats_seqs, center=not authors)
        self.device = target.device
        self.head.to(self.device).train()
        self.t2d = self._target_to_draft()
        self.opt = self._optimizer()
        self.row_weights = cfg.row_decay ** torch.arange(cfg.n_mask + 1, dtype=torch.float32, device=self.device)
        self.step = 0
        self.tokens_seen = 0
        self.sequences_seen = 0
        self.best = -1.0
        self.history: list[dict] = []
        self.sessions: list[dict] = []   # one entry per fit() call: command, commit, first step, minutes trained
        self._fit_started = self._checkpointed_at = time.time()   # reset by each fit()
        self._sequences = None            # fit()'s source of training sequences
        self.branched_from: dict | None = None   # {"run", "step"}: the run whose checkpoint this one started from
        self._evaluated_at: int | None = None   # the last evaluated step, known to every process alike
        self.model = TrainingForward(self.head)   # under DDP from fit() on when several processes train

    def _optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.head.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)

    @property
    def coverage(self) -> float:
        """Share of the held-out target tokens inside the draft vocabulary."""
        d2t = self.head.d2t
        return 1.0 if d2t is None else vocab_coverage(self.heldout, d2t.cpu(), self.target.vocab_size)

    def _target_to_draft(self) -> torch.Tensor | None:
        """[V] draft index of each target token (-1 outside the draft vocabulary), from the head's own d2t."""
        if self.head.d2t is None:
            return None
        d2t = self.head.d2t.cpu()  # batches are built on the cpu
        t2d = torch.full((self.target.vocab_size,), -1, dtype=torch.long)
        t2d[d2t] = torch.arange(len(d2t))
        return t2d

    # schedule: linear warmup, cosine to 10% (over the steps after the warmup, or over the last decay_steps)
    def lr_at(self, step: int, time_spent: float = 0.0) -> float:
        """time_spent: the share of --minutes this session has used; with schedule "time" the cosine is as far as
        the further of it and the steps, so it ends at the time limit whatever the device's speed. With
        decay_steps the rate holds at lr until the last decay_steps steps (a long run's trunk holds it; a branch
        of it anneals, giving a head at a schedule's end while the trunk goes on)."""
        c = self.cfg
        if step < c.warmup:
            return c.lr * (step + 1) / c.warmup
        if c.decay_steps:
            frac = min(1.0, max(0.0, (step - (c.max_steps - c.decay_steps)) / c.decay_steps))
        else:
            frac = min(1.0, (step - c.warmup) / max(1, c.max_steps - c.warmup))
        if c.schedule == "time":
            frac = max(frac, min(1.0, time_spent))
        return c.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    def _time_spent(self) -> float:
        """The share of --minutes used since this session's fit began, the same in every process (their mean)."""
        if self.cfg.schedule != "time" or not self.cfg.minutes:
            return 0.0
        spent = torch.tensor([(time.time() - self._fit_started) / (60 * self.cfg.minutes)], dtype=torch.float64)
        return float(distributed.summed(spent)[0]) / distributed.world_size()

    @property
    def bf16(self) -> bool:
        """Whether the head trains under bf16 autocast: asked for, and native here."""
        return self.cfg.bf16 and native_bf16(self.device)

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def anchor_rng(self, index: int) -> random.Random:
        """The anchors of the index-th training sequence: drawn from (seed, index) alone, so that they do not depend
        on which process trains it or how many processes there are (nor on a resume)."""
        return random.Random(f"{self.cfg.seed}/{index}")

    def _forward(self, seqs: list[SequenceExample], rngs: list[random.Random], model=None):
        """(the stacked batch of the sequences with anchors, on the training device; the head's logits [B, A, R, Vd]
        for them in one forward; the places in `seqs` of those without an anchor, left out). The batch and logits
        are None where no sequence has an anchor. model: what computes the logits (default the head's own
        TrainingForward, no DDP)."""
        kept, missing = [], []
        for i, (seq, rng) in enumerate(zip(seqs, rngs)):
            batch = sequence_batch(seq, self.cfg.n_mask + 1, self.cfg.anchors, rng, self.t2d)
            if batch is None:
                missing.append(i)
            else:
                kept.append((seq, batch))
        if not kept:
            return None, None, missing
        on_host = AnchorBatch.stack([b for _, b in kept])
        batch = on_host.to(self.device)
        with self._autocast():
            logits = head_logits(model or TrainingForward(self.head), self.target, [s for s, _ in kept],
                                 on_host.anchors, batch.anchors)
        return batch, logits, missing

    def _groups(self, items: list) -> list[list]:
        """`items` in groups of sequence_batch: what goes through one head forward."""
        size = max(1, self.cfg.sequence_batch)
        return [items[i:i + size] for i in range(0, len(items), size)]

    @torch.no_grad()
    def evaluate(self) -> Evaluation:
        self.head.eval()
        tot = RowStats.zeros(self.cfg.n_mask + 1, self.device)
        losses = []
        rng = random.Random(1234)  # the same anchors at every evaluation (drawn in the sequences' order)
        for group in self._groups(self.heldout):
            batch, logits, _ = self._forward(group, [rng] * len(group))
            if batch is None:
                continue
            losses.append(soft_ce(logits, batch, self.row_weights).float())
            tot = tot + row_stats(logits, batch)
        self.head.train()
        losses = torch.cat(losses).tolist() if losses else []
        rows, chain1, chain3 = torch.stack((tot.rows, tot.chain1, tot.chain3)).tolist()
        n = max(int(rows), 1)
        return Evaluation(heldout_loss=round(sum(losses) / len(losses), 4) if losses else None,
                          row_top1=[round(x / n, 4) for x in tot.hit1.tolist()],
                          chain_tau=round(1 + chain1 / n, 4), top3_tau_bound=round(1 + chain3 / n, 4),
                          anchors=n, chain_lengths=[int(x) for x in tot.chain_hist.tolist()])

    def save(self, directory, metrics: dict, command: str = "") -> None:
        """The head in the run's format, and metrics.json beside it (the run's provenance and held-out metrics)."""
        head = self.head
        minutes = minutes_trained(self.sessions)
        lineage = {}
        if self.started_from is not None:
            before = self.started_from.get("train_minutes_total", self.started_from.get("train_minutes"))
            lineage = {"started_from": self.started_from,  # None: the starting head never recorded its time
                       "train_minutes_total": None if before is None else round(minutes + before, 1)}
        head.config.extra = {"command": command, "commit": _git_commit(), "sessions": self.sessions,
                             "train_minutes": round(minutes, 1), **lineage,
                             "steps": self.step, "format": self.cfg.head_format,
                             "world_size": distributed.world_size(), **self.provenance,
                             "tokens_seen": self.tokens_seen, "sequences_seen": self.sequences_seen,
                             "heldout_sequences": len(self.heldout), "vocab_coverage": round(self.coverage, 4),
                             "heldout": metrics, "train_config": self.cfg.__dict__, "head_bf16": self.bf16,
                             **({"branched_from": self.branched_from} if self.branched_from else {})}
        if self.cfg.head_format == "authors":
            save_authors(head, directory, max_positions=self.target.max_positions)
        else:
            head.save(directory)
        (Path(directory) / "metrics.json").write_text(json.dumps(head.config.extra, indent=2))

    def _saved_step(self, name: str) -> int | None:
        """The step of the head saved in the run folder's `name`/ (None: none there)."""
        path = self.out / name / "metrics.json"
        return json.loads(path.read_text()).get("steps") if path.is_file() else None

    def checkpoint(self) -> None:
        """Everything a resume needs to go on exactly as if never stopped, written whole or not at all."""
        self._record_session_minutes()
        self._checkpointed_at = time.time()
        torch.save({"head": self.head.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                    "tokens_seen": self.tokens_seen, "best": self.best, "sequences_seen": self.sequences_seen,
                    "history": self.history, "sessions": self.sessions, "branched_from": self.branched_from,
                    "head_format": self.cfg.head_format, "started_from": self.started_from}, self.out / "ckpt.tmp")
        (self.out / "ckpt.tmp").rename(self.out / "ckpt.pt")

    def _record_session_minutes(self) -> None:
        """Wall-clock time of this fit() so far (only fit() saves): a run's total training time stays on record."""
        self.sessions[-1]["minutes"] = (time.time() - self._fit_started) / 60

    def resume(self) -> bool:
        """Continue from the run folder's checkpoint (written by any number of processes, read by any number)."""
        path = self.out / "ckpt.pt"
        if not path.is_file():
            return False
        state = torch.load(path, weights_only=False, map_location=self.device)
        saved_format = state.get("head_format", "dartlab")
        if saved_format != self.cfg.head_format:
            raise TrainingError(f"{path} is a run with --format {saved_format}; resume it with --format "
                                f"{saved_format} (or train into another --out)")
        saved_d2t = state["head"].get("d2t")
        if saved_d2t is not None and self.head.d2t is not None and len(saved_d2t) < len(self.head.d2t):
            self._resume_with_larger_vocab(state, saved_d2t)
        else:
            self.head.load_state_dict(state["head"])
            self.opt.load_state_dict(state["opt"])
        self.t2d = self._target_to_draft()  # the checkpoint's vocabulary, not one chosen afresh
        self.step, self.tokens_seen, self.best = state["step"], state["tokens_seen"], state["best"]
        self.sequences_seen = state["sequences_seen"]
        self.history = state["history"]
        self.sessions = state.get("sessions", [])
        self.branched_from = state.get("branched_from")
        if "started_from" in state:  # the run's lineage is its own, whatever --init-from now names (a newer head)
            self.started_from = state["started_from"]
        self._evaluated_at = self.history[-1]["step"] if self.history else None
        return True

    def _resume_with_larger_vocab(self, state: dict, saved_d2t: torch.Tensor) -> None:
        """--draft-vocab grew since the checkpoint: keep every learned weight and the optimizer's moments, add
        the most frequent missing tokens. New rows' second moments start at the old rows' mean, so their first
        updates are as large as everyone else's, not 1/sqrt(1-beta2) times larger."""
        small = DraftHead(replace(self.head.config, draft_vocab_size=len(saved_d2t))).to(self.device)
        small.load_state_dict(state["head"])
        d2t = self._choose_vocab(must_include=saved_d2t.tolist()).to(self.device)
        self.head = grow_draft_vocab(small, self.target, d2t).train()
        self.model = TrainingForward(self.head)
        self.opt = self._optimizer()
        self.opt.load_state_dict(state["opt"])  # same parameter order; only lm_head's moments change shape
        rows = torch.searchsorted(d2t, saved_d2t.to(self.device))
        moments = self.opt.state[self.head.lm_head.weight]
        for key, fill in (("exp_avg", 0.0), ("exp_avg_sq", float(moments["exp_avg_sq"].mean()))):
            grown = torch.full_like(self.head.lm_head.weight, fill)
            grown[rows] = moments[key]
            moments[key] = grown
        print(f"[train] draft vocabulary grown from {len(saved_d2t)} to {len(d2t)} tokens", flush=True)

    def fit(self, next_sequence, command: str = "") -> dict:
        """Train until max_steps or the time limit. next_sequence(i) returns the i-th training sequence
        (sequences are counted across resumes, so a resumed run continues with fresh data; with several
        processes, each step's sequences are shared out among them)."""
        c = self.cfg
        deadline = time.time() + c.minutes * 60 if c.minutes else math.inf
        self.model = distributed.wrap(TrainingForward(self.head), self.device)
        progress = Progress(c.max_steps, self.step, deadline, enabled=distributed.is_main())
        metrics = self.history[-1] if self.history else {}
        self.sessions.append({"command": command, "commit": _git_commit(), "from_step": self.step, "minutes": 0.0,
                              "world_size": distributed.world_size()})
        self._fit_started = self._checkpointed_at = time.time()
        self._sequences = next_sequence
        if self.started_from is not None and not self.history:  # the starting head's score: the bar to beat
            metrics = self._eval_and_keep(command)
        while self.step < c.max_steps and distributed.all_agree(time.time() < deadline):
            stats = self._train_step(next_sequence)
            progress.update(self.step, stats)
            if self.step % c.eval_every == 0:
                metrics = self._eval_and_keep(command)
            elif distributed.is_main() and time.time() - self._checkpointed_at > c.checkpoint_minutes * 60:
                self.checkpoint()   # only rank 0 writes; the next step's gradient sync is the others' wait
        progress.close()
        if self._evaluated_at != self.step:  # not just evaluated in the loop
            metrics = self._eval_and_keep(command)
        if self.step >= c.max_steps and distributed.is_main() and self._saved_step("best") != self.step:
            self.save(self.out / "end", metrics, command)   # the schedule's end (a fit point), where not the best
        return {"best_chain_tau": self.best, "last": metrics, "steps": self.step}

    def _train_step(self, next_sequence) -> dict:
        """One optimizer step over `accumulate` sequences per process, sequence_batch of them per forward (the
        gradient is the mean of the sequences' own, however they are grouped). Returns the step's anchor tokens, its
        loss (the mean over every process's sequences), and its row-0 top-1 and chain tau over their anchors."""
        c, world = self.cfg, distributed.world_size()
        lr = self.lr_at(self.step, self._time_spent())
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.opt.zero_grad(set_to_none=True)
        first = self.sequences_seen + distributed.rank() * c.accumulate  # this process's share of the step
        groups = self._groups(list(range(first, first + c.accumulate)))
        # sequences, anchor tokens, loss, anchors counted, row-0 hits, chain: summed where the logits are, read once
        sums = torch.zeros(6, dtype=torch.float64, device=self.device)
        for k, group in enumerate(groups):
            with distributed.no_sync(self.model, sync=k == len(groups) - 1):
                batch, logits, missing = self._forward([next_sequence(i) for i in group],
                                                       [self.anchor_rng(i) for i in group], self.model)
                if missing and world > 1:  # the other processes would wait for this one's gradients forever
                    raise TrainingError(f"training sequence {group[missing[0]]} has no anchor (a reply of under 2 "
                                        "tokens); such sequences must be left out before training")
                if batch is None:
                    continue
                losses = soft_ce(logits, batch, self.row_weights)
                (losses.sum() / c.accumulate).backward()
            st = row_stats(logits.detach(), batch)
            sums[0] += losses.numel()
            sums[1:] += torch.stack((batch.real.sum(), losses.detach().sum(), st.rows, st.hit1[0], st.chain1)).double()
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
        self.opt.step()
        self.step += 1
        self.sequences_seen += c.accumulate * world
        # the step's one wait for the device, after the optimizer's work is queued
        sequences, tokens, loss, counted, row0, chain = distributed.summed(sums).tolist()
        self.tokens_seen += int(tokens)
        n, anchors = max(sequences, 1.0), max(counted, 1.0)
        return {"tokens": int(tokens), "loss": loss / n, "row0": row0 / anchors, "chain_tau": 1 + chain / anchors}

    def _eval_and_keep(self, command: str) -> dict:
        """Rank 0 evaluates, keeps the best head and checkpoints; the other processes wait for it."""
        metrics, self._evaluated_at = {}, self.step
        if distributed.is_main():
            self._record_session_minutes()   # for the saved head's metrics
            # how the sequences' features and labels are computed, where the source says (data.ExampleStream)
            self.sessions[-1]["features_and_labels"] = getattr(self._sequences, "choice", None)
            metrics = {"step": self.step, "tokens_seen": self.tokens_seen, **self.evaluate().to_dict()}
            self.history.append(metrics)
            tqdm.write(f"[eval] step {self.step}: {json.dumps(metrics)}")
            if metrics["chain_tau"] > self.best:
                self.best = metrics["chain_tau"]
                self.save(self.out / "best", metrics, command)
            self.checkpoint()
        distributed.barrier()
        return metrics


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
