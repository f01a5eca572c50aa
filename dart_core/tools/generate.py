"""`python -m dart_core generate`: decode one prompt, print the text (or one JSON object), optionally save the trace."""

from __future__ import annotations

import json
import sys

from ..acceptance import SamplingConfig
from ..decoding import GenerationConfig, generate
from ..metrics import Metrics
from ..methods import uses_head
from ..setup.chat import encode_prompt
from ..setup.files import check_writable
from ..setup.loading import DraftSettings, load
from .args import (THINKING_HELP, CliError, add_method_arg, add_model_args, add_search_args, auto_budget_from,
                   search_config_from)


def register(sub) -> None:
    g = sub.add_parser("generate", help="decode one prompt and report the result")
    add_model_args(g)
    add_method_arg(g)
    g.add_argument("--prompt", required=True)
    g.add_argument("--raw", action="store_true", help="do not apply the chat template")
    g.add_argument("--thinking", action="store_true", help=THINKING_HELP)
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--max-context", type=int, default=None, help="prompt + output tokens at most")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--trace", default=None,
                   help="write the full step trace to this JSON file (gzip-compressed when it ends in .gz)")
    g.add_argument("--trace-top", type=int, default=None, metavar="N",
                   help="keep only the best N tree-search candidates of each step in the trace (and the tree's own)")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    add_search_args(g)
    g.set_defaults(handler=cmd_generate)


def cmd_generate(args) -> int:
    sampling = SamplingConfig(args.temperature, args.top_p, args.top_k, args.seed).validate()
    gen_cfg = GenerationConfig(args.max_new_tokens, sampling, max_context=args.max_context).validate()
    search_cfg = search_config_from(args)
    if not args.prompt.strip():
        raise CliError("the prompt is empty")
    if args.trace_top is not None and args.trace_top < 0:
        raise CliError(f"--trace-top must be >= 0, got {args.trace_top}")
    if args.trace:
        check_writable(args.trace)   # before minutes of decoding, not after
    auto = auto_budget_from(args)
    loaded = load(args.model, args.draft, args.ngram, args.device, args.dtype, with_head=uses_head(args.method),
                  recalibrate=args.recalibrate, draft_kernels=args.draft_kernels)
    target = loaded.target
    gen_cfg.stop_ids = loaded.stop_ids
    settings = DraftSettings(search_cfg, auto, lookup_tokens=args.lookup_tokens,
                             context_weight=args.ngram_context_weight)
    proposer = loaded.proposer(args.method, settings, args.recalibrate)
    prompt_ids = encode_prompt(target.tokenizer, args.prompt, raw=args.raw, thinking=args.thinking)
    trace = loaded.new_trace(args.method, prompt_ids, args.prompt, sampling, args.max_new_tokens, settings)
    metrics = Metrics()
    for step in generate(target, proposer, prompt_ids, gen_cfg):
        trace.steps.append(step)
        metrics.observe(step)
        if not args.json:
            print(target.tokenizer.decode(step.new_tokens), end="", flush=True)
    text = target.tokenizer.decode(trace.output_ids, skip_special_tokens=True)
    if args.trace:
        trace.name_tokens(target.tokenizer)
        trace.save(args.trace, top_candidates=args.trace_top)
    figures = metrics.to_dict()
    result = {"method": args.method, "token_ids": trace.output_ids, "text": text, "steps": metrics.verify_steps,
              "tau": round(metrics.tau, 4), "tokens_per_s": round(metrics.tokens_per_s, 3),
              "stop_reason": trace.steps[-1].stop_reason, "metrics": figures,
              **trace.settings.machine.to_dict(),   # where it ran, as the trace records it
              "node_budget": budget_summary(trace, figures["node_budgets"])}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"\n[{args.method}] {metrics.new_tokens} tokens, {metrics.verify_steps} steps, tau {metrics.tau:.2f}, "
              f"{metrics.tokens_per_s:.1f} tok/s", file=sys.stderr)
    return 0


def budget_summary(trace, used: dict[str, int]) -> dict | None:
    """The node budgets the run's DART steps used (`used`: Metrics' count per budget), and the last automatic choice
    with its reasons."""
    budgets = [s.budget for s in trace.steps if s.budget]
    if not budgets:
        return None
    choice = next((b.choice for b in reversed(budgets) if b.choice is not None), None)
    lookups = [b.lookup for b in budgets if b.lookup is not None]
    return {"auto": budgets[-1].auto, "start": budgets[0].nodes, "used": used,
            **({"lookup_used": {str(n): lookups.count(n) for n in sorted(set(lookups))}} if lookups else {}),
            "last_choice": None if choice is None else choice.to_dict()}
