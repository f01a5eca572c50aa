"""Command line: `python -m dart_core generate ...` (and the subcommands other modules register).

Bad arguments exit with status 2 and one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

from .tree_search import SearchConfig


class CliError(Exception):
    """An error to report in one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_search_args(p: argparse.ArgumentParser) -> None:
    d = SearchConfig()
    g = p.add_argument_group("tree search knobs")
    g.add_argument("--node-budget", type=int, default=None,
                   help="draft tree nodes besides the root (default: 8 on CPU, measured; 60 elsewhere)")
    g.add_argument("--beam-width", type=int, default=d.beam_width)
    g.add_argument("--topk-per-row", type=int, default=d.topk, help="candidates per draft row")
    g.add_argument("--ngram-weight", type=float, default=d.ngram_weight)
    g.add_argument("--level-exponent", type=float, default=d.level_exponent, help="level weight (l+1)^-x")
    g.add_argument("--logit-decay", type=float, default=d.logit_decay, help="logit weight decay^l")
    g.add_argument("--ngram-context-weight", type=float, default=0.0,
                   help="also count the prompt's and output's own n-grams, with this weight (0 = static table only)")
    g.add_argument("--lookup-tokens", type=int, default=None,
                   help="dart_pld: tokens in the prompt-lookup branch added to DART's tree (default: 5, measured)")


def search_config_from(args) -> SearchConfig:
    from .loading import default_search_config

    lookup_tokens = getattr(args, "lookup_tokens", None)
    if lookup_tokens is not None and lookup_tokens < 1:
        raise CliError("--lookup-tokens must be at least 1")
    budget = args.node_budget
    if budget is None:
        budget = default_search_config(getattr(args, "device", "cpu")).node_budget
    return SearchConfig(topk=args.topk_per_row, beam_width=args.beam_width, node_budget=budget,
                        level_exponent=args.level_exponent, logit_decay=args.logit_decay,
                        ngram_weight=args.ngram_weight).validate()


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct), a transformers folder, "
                                                      "or a hub id where the hub is reachable")
    p.add_argument("--draft", default="default", help="'default' (the shipped head), 'random', or a head folder")
    p.add_argument("--ngram", default="default", help="'default', 'none', or an n-gram .npz file")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16", "float32", "bfloat16", "float16"])


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m dart_core", description="DART speculative decoding engine")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="decode one prompt and report the result")
    add_model_args(g)
    g.add_argument("--method", default="dart", choices=["dart", "vanilla", "pld", "dart_pld"],
                   help="dart_pld: DART's tree plus prompt lookup's continuation as one more branch")
    g.add_argument("--prompt", required=True)
    g.add_argument("--raw", action="store_true", help="do not apply the chat template")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--max-context", type=int, default=None, help="prompt + output tokens at most")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--trace", default=None, help="write the full step trace to this JSON file")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    add_search_args(g)

    from . import commands  # the other subcommands (train, ngram, bench) register themselves
    commands.register(sub)
    return parser


def cmd_generate(args) -> int:
    from .acceptance import SamplingConfig
    from .decoding import GenerationConfig, generate
    from .loading import encode_prompt, load_target, make_proposer, stop_ids
    from .metrics import Metrics
    from .trace import Trace

    sampling = SamplingConfig(args.temperature, args.top_p, args.top_k, args.seed).validate()
    gen_cfg = GenerationConfig(args.max_new_tokens, sampling, max_context=args.max_context).validate()
    search_cfg = search_config_from(args)
    if not args.prompt.strip():
        raise CliError("the prompt is empty")
    target = load_target(args.model, args.device, args.dtype)
    gen_cfg.stop_ids = stop_ids(target)
    proposer = make_proposer(args.method, target, args.draft, args.ngram, search_cfg,
                             context_weight=args.ngram_context_weight, lookup_tokens=args.lookup_tokens)
    prompt_ids = encode_prompt(target, args.prompt, raw=args.raw)
    settings = {"model": args.model, "draft": args.draft, "ngram": args.ngram, "device": args.device,
                "dtype": args.dtype, "sampling": sampling.to_dict(), "search": search_cfg.to_dict(),
                "max_new_tokens": args.max_new_tokens}
    trace = Trace(method=args.method, prompt_ids=prompt_ids, prompt_text=args.prompt, settings=settings)
    metrics = Metrics()
    for step in generate(target, proposer, prompt_ids, gen_cfg):
        trace.steps.append(step)
        metrics.observe(step)
        if not args.json:
            print(target.tokenizer.decode(step.new_tokens), end="", flush=True)
    text = target.tokenizer.decode(trace.output_ids, skip_special_tokens=True)
    if args.trace:
        trace.fill_token_text(target.tokenizer)
        trace.save(args.trace)
    result = {"method": args.method, "token_ids": trace.output_ids, "text": text, "steps": metrics.verify_steps,
              "tau": round(metrics.tau, 4), "tokens_per_s": round(metrics.tokens_per_s, 3),
              "stop_reason": trace.steps[-1].stop_reason, "metrics": metrics.to_dict()}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"\n[{args.method}] {metrics.new_tokens} tokens, {metrics.verify_steps} steps, tau {metrics.tau:.2f}, "
              f"{metrics.tokens_per_s:.1f} tok/s", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args) if hasattr(args, "handler") else cmd_generate(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (CliError, ValueError, OSError, RuntimeError, ImportError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"error: {message}", file=sys.stderr)
        return 2
