"""Training data for the draft head: token sequences, the target's features on them, and the target's labels.

Step 1 (`generate_responses`): ShareGPT first user turns in the model's chat template, answered greedily by the
target in batches. Output: a jsonl file, appended batch by batch so an interrupted run resumes where it stopped.

Code (`stdlib_code_sequences`): functions with docstrings from the Python standard library, posed as HumanEval
poses its problems (signature and docstring, "Complete the following Python function."), answered with the
function's own code. ShareGPT is chat; without these the head sees little code, where prompt lookup is strongest.
Nothing is downloaded or shipped: the interpreter's own library is read at training time (so the set depends on the
Python version; ids name file and line).

Step 2 (`sequence_example`, called by the trainer as it goes): one target forward per sequence (self-generated
responses, or ShareGPT conversations as written) with the three feature taps, or one over several padded ones
(`ExampleStream`'s group: on a GPU, one sequence per forward leaves it idle on Python). Labels come from the same
forward: the target's own top-k next-token distribution at every position, so the head learns what the target would
say, not what ShareGPT said.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import shutil
import sysconfig
import textwrap
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..decoding import cut_at_stop
from ..formats.jsonl import append_jsonl, read_jsonl
from ..setup.chat import chat_ids
from ..setup.datasets import CODE_COMPLETION_PROMPT, iter_sharegpt
from ..target import TargetModel
from .records import SequenceExample

LABEL_TOPK = 8
CACHE_FREE_FLOOR = 4 << 30   # the feature cache stops growing below this much free disk: training goes on
LENGTH_SORT_BATCHES = 8   # generation sorts prompts by length within windows of this many batches


def sharegpt_prompts(tokenizer, limit: int, max_prompt_tokens: int, seed: int = 0) -> list[tuple[str, list[int]]]:
    """(id, prompt ids) for the first user turn of ShareGPT conversations, shuffled, short enough to fit."""
    items = []
    for n, conv in enumerate(iter_sharegpt()):
        if conv[0]["role"] != "user":
            continue
        ids = chat_ids(tokenizer, [conv[0]], add_generation_prompt=True)
        if 4 <= len(ids) <= max_prompt_tokens:
            items.append((f"sharegpt/{n}", ids))
    random.Random(seed).shuffle(items)
    return items[:limit]


def chat_record(tokenizer, record_id: str, user: dict, reply: dict, max_tokens: int, thinking: bool = False
                ) -> dict | None:
    """One training record (prompt ids, reply ids cut to max_tokens in all) for a user turn and its reply in the chat
    template, or None when the prompt leaves under 32 tokens for the reply or the template does not split cleanly."""
    return turns_record(tokenizer, record_id, [user], reply, max_tokens, thinking)


def turns_record(tokenizer, record_id: str, history: list[dict], reply: dict, max_tokens: int,
                 thinking: bool = False) -> dict | None:
    """`chat_record` for a reply after any number of turns (system, user, earlier replies): the prompt is the
    history with the generation prompt (Qwen3's thinking switch as asked), the response the reply's own tokens."""
    prompt = chat_ids(tokenizer, history, add_generation_prompt=True, thinking=thinking)
    full = chat_ids(tokenizer, [*history, reply], add_generation_prompt=False, thinking=thinking)
    if len(prompt) < max_tokens - 32 and full[: len(prompt)] == prompt:
        return {"id": record_id, "prompt_ids": prompt, "response_ids": full[len(prompt):max_tokens]}
    return None


def sharegpt_sequences(tokenizer, skip_ids: set[str], limit: int, max_tokens: int, seed: int = 1,
                       thinking: bool = False):
    """ShareGPT conversations as written (chat template, first two turns), cut to max_tokens."""
    out = []
    for n, conv in enumerate(iter_sharegpt()):
        if f"sharegpt/{n}" in skip_ids or conv[0]["role"] != "user" or len(conv) < 2:
            continue
        record = chat_record(tokenizer, f"sharegpt-text/{n}", conv[0], conv[1], max_tokens, thinking)
        if record is not None:
            out.append(record)
    random.Random(seed).shuffle(out)
    return out[:limit]


def fixed_heldout(tokenizer, max_tokens: int, chat: int = 32, code: int = 16, thinking: bool = False,
                  stdlib_root: Path | None = None) -> list[dict]:
    """The held-out set every run can share (`train --heldout-set fixed`): the `chat` ShareGPT conversations (as
    written) and the `code` standard-library functions whose ids hash lowest, among those that make a record. It
    depends on neither the training mix, its counts nor the seed, so runs with different data compare on it."""
    def lowest(ids: list[str], make, n: int) -> list[dict]:
        out = []
        for rid in sorted(ids, key=lambda i: hashlib.sha256(i.encode()).hexdigest()):
            record = make(rid) if len(out) < n else None
            out += [record] if record is not None else []
        return out

    convs = {f"sharegpt-text/{n}": c for n, c in enumerate(iter_sharegpt())
             if len(c) >= 2 and c[0]["role"] == "user"}
    chat_recs = lowest(list(convs), lambda rid: chat_record(tokenizer, rid, convs[rid][0], convs[rid][1],
                                                            max_tokens, thinking), chat)
    functions = {f"stdlib/{where}": (header, body) for where, header, body in
                 documented_functions(Path(stdlib_root or sysconfig.get_paths()["stdlib"]))} if code else {}
    code_recs = lowest(list(functions), lambda rid: code_record(tokenizer, rid, *functions[rid], max_tokens,
                                                                thinking), code)
    return chat_recs + code_recs


def same_source(record_id: str) -> str:
    """What a record's id says of its source text: a ShareGPT prompt answered by the target (sharegpt/N) and the
    same conversation as written (sharegpt-text/N) share a prompt, so a held-out one keeps both out of training."""
    return record_id.replace("sharegpt-text/", "sharegpt/")


SKIPPED_STDLIB_DIRS = {"test", "tests", "site-packages", "dist-packages", "idlelib", "lib2to3", "turtledemo"}


def documented_functions(root: Path):
    """(where, header, code) per function with a docstring and a body under `root`: header = the def line(s) and
    the docstring; code = the def line(s) and the body without the docstring, both dedented."""
    for path in sorted(root.rglob("*.py")):
        if SKIPPED_STDLIB_DIRS & set(path.relative_to(root).parts[:-1]):
            continue
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue  # a file this interpreter cannot read or parse is simply not used
        lines = source.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or len(node.body) < 2:
                continue
            if ast.get_docstring(node) is None:
                continue
            doc, first = node.body[0], node.body[1]
            signature = lines[node.lineno - 1: doc.lineno - 1]
            header = textwrap.dedent("\n".join(signature + lines[doc.lineno - 1: doc.end_lineno]))
            code = textwrap.dedent("\n".join(signature + lines[first.lineno - 1: node.end_lineno]))
            yield f"{path.relative_to(root)}:{node.lineno}", header, code


def code_record(tokenizer, record_id: str, header: str, code: str, max_tokens: int, thinking: bool = False):
    """A function posed as HumanEval poses its problems (signature and docstring), answered with its own code."""
    user = {"role": "user", "content": CODE_COMPLETION_PROMPT.format(code=header + "\n")}
    reply = {"role": "assistant", "content": f"```python\n{code}\n```"}
    return chat_record(tokenizer, record_id, user, reply, max_tokens, thinking)


def stdlib_code_sequences(tokenizer, limit: int, max_tokens: int, seed: int = 2, root: Path | None = None,
                          thinking: bool = False):
    """Up to `limit` HumanEval-style code sequences (chat template) from the standard library, shuffled."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    out = []
    for where, header, code in documented_functions(root):
        record = code_record(tokenizer, f"stdlib/{where}", header, code, max_tokens, thinking)
        if record is not None:
            out.append(record)
    random.Random(seed).shuffle(out)
    return out[:limit]


@dataclass(frozen=True)
class ResponseSettings:
    """Which prompts `generate_responses` answers, and how."""
    limit: int = 2000               # prompts answered: the `limit` after the first `skip` in a fixed order
    skip: int = 0                   # so a machine that lacks an earlier one's file answers new prompts
    batch_size: int = 32
    max_new_tokens: int = 256
    max_prompt_tokens: int = 192    # ShareGPT prompts longer than this are not asked
    stop_ids: tuple[int, ...] = ()
    seed: int = 0                   # ShareGPT prompts' fixed order
    seconds: float = 0.0            # stop after this long (0: no limit); the batch running then is cut there


@torch.inference_mode()
def generate_responses(model, tokenizer, out_path, settings: ResponseSettings = ResponseSettings(),
                       prompts: list[tuple[str, list[int]]] | None = None) -> int:
    """Answer ShareGPT prompts greedily with the target; append records to `out_path`. Returns records written.
    `prompts`: (id, prompt ids) to answer instead of ShareGPT's (from `train-data export`, for a machine without
    the data package). A batch cut by `settings.seconds` keeps its answers as far as they got (the target's own
    greedy tokens all the same)."""
    s = settings
    deadline = time.monotonic() + s.seconds if s.seconds else float("inf")
    done = {r["id"] for r in read_jsonl(out_path)} if Path(out_path).is_file() else set()
    if prompts is None:
        prompts = sharegpt_prompts(tokenizer, s.skip + s.limit, s.max_prompt_tokens, s.seed)
    prompts = prompts[s.skip: s.skip + s.limit]
    todo = [p for p in prompts if p[0] not in done]
    # similar lengths per batch (little padding), sorted within windows of the fixed order: a run cut by its time
    # limit has answered a sample of the prompts, not only the shortest ("hi", "hey": greetings, 10-token replies)
    window = s.batch_size * LENGTH_SORT_BATCHES
    todo = [p for w in range(0, len(todo), window) for p in sorted(todo[w: w + window], key=lambda p: len(p[1]))]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    written = 0
    bar = tqdm(total=len(todo), desc="generating responses", unit="prompt")
    with append_jsonl(out_path) as fh:     # a record cut by an earlier stop is dropped: it is answered again
        for start in range(0, len(todo), s.batch_size):
            batch = todo[start: start + s.batch_size]
            width = max(len(ids) for _, ids in batch)
            input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for _, ids in batch], device=model.device)
            attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for _, ids in batch],
                                     device=model.device)
            left = deadline - time.monotonic()   # a batch running past the limit ends there (its answers cut)
            out = model.generate(input_ids=input_ids, attention_mask=attention, max_new_tokens=s.max_new_tokens,
                                 do_sample=False, pad_token_id=pad, eos_token_id=list(s.stop_ids) or None,
                                 max_time=max(left, 0.1) if s.seconds else None)
            for (pid, ids), row in zip(batch, out[:, width:].tolist()):
                response = cut_at_stop(row, s.stop_ids, s.max_new_tokens)
                fh.write(json.dumps({"id": pid, "prompt_ids": ids, "response_ids": response}) + "\n")
                written += 1
            fh.flush()
            bar.update(len(batch))
            if time.monotonic() > deadline:
                break
    bar.close()
    return written


LABEL_CHUNK_ROWS = 32  # positions per pass on a CPU: their float logits stay in cache
LABEL_CHUNK_ROWS_GPU = 2048   # on a GPU each pass costs kernel launches: a batch of sequences in a few


def top_labels(logits: torch.Tensor, k: int = LABEL_TOPK) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k ids [T, k] of softmax(logits) and their probabilities. The top k are taken on the logits
    themselves (softmax keeps their order); the softmax's denominator, a chunk of positions at a time (a softmax
    of the whole [T, V] in float is memory-bound: about twice as slow on these CPUs)."""
    chunk = LABEL_CHUNK_ROWS if logits.device.type == "cpu" else LABEL_CHUNK_ROWS_GPU
    top = logits.topk(k, dim=-1)
    peak = top.values[:, :1].float()
    total = torch.cat([(logits[i:i + chunk].float() - peak[i:i + chunk]).exp_().sum(-1, True)
                       for i in range(0, logits.shape[0], chunk)])
    return top.indices, (top.values.float() - peak).exp_() / total


def sequence_example(target: TargetModel, prompt_ids: list[int], response_ids: list[int]) -> SequenceExample:
    """One training sequence: ids, where the response starts, features [T, 3H] and the target's top-k labels."""
    return sequence_examples(target, [(prompt_ids, response_ids)])[0]


@torch.inference_mode()
def sequence_examples(target: TargetModel, pairs: list[tuple[list[int], list[int]]]) -> list[SequenceExample]:
    """`sequence_example` of each (prompt ids, response ids), the target run once over all of them (padded)."""
    rows = [list(p) + list(r) for p, r in pairs]
    width = max(len(ids) for ids in rows)
    padded = torch.tensor([ids + [0] * (width - len(ids)) for ids in rows], device=target.device)
    logits, feats = target.forward_padded(padded, [len(ids) for ids in rows])
    B, T, V = logits.shape
    # every row's labels at once (each row's alone: the padding's are computed and dropped), and one copy of each
    # kind to the host: on a GPU, per sequence they were many small launches and three waits
    label_ids, label_probs = top_labels(logits.reshape(B * T, V))
    label_ids, label_probs = (t.view(B, T, -1).cpu() for t in (label_ids.to(torch.int32), label_probs.half()))
    feats = feats.to(torch.bfloat16).cpu()
    return [SequenceExample(ids=torch.tensor(ids, dtype=torch.int32), prompt_len=len(prompt),
                            features=feats[b, :len(ids)].clone(), label_ids=label_ids[b, :len(ids)].clone(),
                            label_probs=label_probs[b, :len(ids)].clone())
            for b, ((prompt, _), ids) in enumerate(zip(pairs, rows))]


def cache_key(target: TargetModel, ids: list[int]) -> str:
    """A name for one sequence's features and labels: the target (name, size, dtype, taps), the label count and
    the token ids, hashed. A changed sequence or another target never reads a stale file."""
    name = Path(str(getattr(target.config, "_name_or_path", "") or "")).name
    salt = "|".join(str(x) for x in (name, target.num_layers, target.hidden_size, target.vocab_size, target.dtype,
                                     target.taps, LABEL_TOPK))
    return hashlib.sha1(salt.encode() + torch.tensor(ids, dtype=torch.int32).numpy().tobytes()).hexdigest()


def cached_example(cache_dir, target: TargetModel, prompt_ids: list[int], response_ids: list[int]
                   ) -> SequenceExample:
    """`sequence_example`, read from `cache_dir` when an earlier epoch or run computed it, else computed and
    stored there (about 3.5 KB per token for SmolLM2-135M: features 3 x 576 bf16, 3,456 B; top-8 labels, 48 B)."""
    return cached_examples(cache_dir, target, [(prompt_ids, response_ids)])[0]


def cached_examples(cache_dir, target: TargetModel, pairs: list[tuple[list[int], list[int]]]
                    ) -> list[SequenceExample]:
    """`cached_example` of each pair: the ones not stored yet computed in one forward."""
    paths = [Path(cache_dir) / f"{cache_key(target, list(p) + list(r))}.pt" for p, r in pairs]
    examples: list[SequenceExample | None] = [None] * len(pairs)
    for i, path in enumerate(paths):
        if path.is_file():
            try:
                examples[i] = SequenceExample.from_dict(torch.load(path, weights_only=True))
            except (RuntimeError, EOFError, OSError, KeyError):
                pass  # a file cut short by a stop: computed again
    missing = [i for i, e in enumerate(examples) if e is None]
    for i, example in zip(missing, sequence_examples(target, [pairs[i] for i in missing]) if missing else []):
        examples[i] = example
        paths[i].parent.mkdir(parents=True, exist_ok=True)
        if shutil.disk_usage(paths[i].parent).free >= CACHE_FREE_FLOOR:
            _store(example, paths[i])
        else:
            warnings.warn(f"the feature cache {cache_dir} stops growing: under {CACHE_FREE_FLOOR >> 30} GiB free on "
                          "its disk (training goes on, computing the rest)", stacklevel=2)
    return examples


def _store(example: SequenceExample, path: Path) -> None:
    """Whole files only: written beside, then renamed (processes of one run may compute the same one); a disk
    that fills while writing loses the file, not the run."""
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        torch.save(example.to_dict(), partial)
        partial.rename(path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        warnings.warn(f"the feature cache could not store {path.name}: {exc}", stacklevel=3)


class ExampleStream:
    """The trainer's `next_sequence`: the i-th training example (record i modulo their count), computed `group`
    at a time in one target forward: i and the next ones this process will ask for (with `world` processes, each
    step's sequences go out in blocks of `accumulate`, one block per process). `measure`: the first group is
    computed a sequence per forward, the second in one, and the faster per token is kept (`choice` says which)."""

    def __init__(self, target: TargetModel, records: list[dict], group: int = 1, cache_dir=None,
                 accumulate: int = 1, world: int = 1, measure: bool = False):
        self.target, self.records, self.group, self.cache_dir = target, records, group, cache_dir
        self.accumulate, self.world = accumulate, world
        self.ready: dict[int, SequenceExample] = {}
        self.trials: list[tuple[int, float]] = [(1, 0.0), (group, 0.0)] if measure and group > 1 else []
        self.choice = f"{group} sequence(s) per forward" + (" (to be measured against 1)" if self.trials else "")

    def upcoming(self, i: int) -> list[int]:
        """i, then the indices this process asks for after it, `group` in all."""
        out = []
        while len(out) < self.group:
            out.append(i)
            i += 1
            if i % self.accumulate == 0:
                i += (self.world - 1) * self.accumulate   # the other processes' blocks
        return out

    def _examples(self, pairs: list[tuple[list[int], list[int]]]) -> list[SequenceExample]:
        if self.cache_dir:
            return cached_examples(self.cache_dir, self.target, pairs)
        return sequence_examples(self.target, pairs)

    def of_records(self, records: list[dict]) -> list[SequenceExample]:
        """The examples of other records (the held-out set, a new head's statistics), `group` per forward."""
        pairs = [(r["prompt_ids"], r["response_ids"]) for r in records]
        return [e for k in range(0, len(pairs), self.group) for e in self._examples(pairs[k:k + self.group])]

    def _measured(self, pairs) -> list[SequenceExample]:
        """The group's examples, computed as the next trial says and timed per token; after both, the choice."""
        per_forward = next(n for n, s in self.trials if not s)
        t0 = time.perf_counter()
        examples = [e for k in range(0, len(pairs), per_forward) for e in self._examples(pairs[k:k + per_forward])]
        per_token = (time.perf_counter() - t0) / sum(len(p) + len(r) for p, r in pairs)
        self.trials = [(n, per_token if n == per_forward and not s else s) for n, s in self.trials]
        if all(s for _, s in self.trials):
            (n1, s1), (ng, sg) = self.trials
            self.group = ng if sg < s1 else 1
            self.choice = (f"{self.group} sequence(s) per forward: measured {s1 * 1e6:.0f} us a token one per "
                           f"forward, {sg * 1e6:.0f} us {ng} per forward")
            self.trials = []
        return examples

    def __call__(self, i: int) -> SequenceExample:
        if i not in self.ready:   # a wrong guess only costs the unused examples
            indices = self.upcoming(i)
            pairs = [(r["prompt_ids"], r["response_ids"]) for r in
                     (self.records[j % len(self.records)] for j in indices)]
            examples = self._measured(pairs) if self.trials else self._examples(pairs)
            self.ready = dict(zip(indices, examples))
        return self.ready.pop(i)
