"""The bench's command-line arguments, and the parsing of its comma lists (--methods, --dtype, --temperature)."""

from __future__ import annotations

from ...setup.models import DTYPES, dtype_name
from ..args import THINKING_HELP, CliError, add_model_args, add_search_args
from .methods import METHODS

DTYPE_NAMES = {name: dtype_name(dtype) for name, dtype in DTYPES.items()}   # every spelling -> fp32, bf16, fp16


def split_list(value: str) -> list[str]:
    return [v.strip() for v in str(value or "").split(",") if v.strip()]


def parse_methods(value: str) -> list[str]:
    methods = split_list(value)
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise CliError(f"unknown method(s) {', '.join(bad) or '(none)'}; use a comma list of {', '.join(METHODS)}")
    return list(dict.fromkeys(methods))


def parse_dtypes(value: str, fast=None) -> list[str]:
    """The bench's dtypes. 'auto' (the default): fp32, and bf16 where it measures faster here (`fast()`: the
    measured choice, dart_core.setup.dtype_choice.fast_dtype)."""
    if value == "auto":
        choice = fast()
        print(f"[bench] dtypes: fp32{', ' + choice.dtype if choice.dtype != 'fp32' else ''} ({choice.reason})",
              flush=True)
        return list(dict.fromkeys(["fp32", choice.dtype]))
    dtypes = []
    for d in split_list(value):
        if d not in DTYPE_NAMES:
            raise CliError(f"unknown dtype {d!r}; use a comma list of fp32, bf16, fp16")
        dtypes.append(DTYPE_NAMES[d])
    if not dtypes:
        raise CliError("--dtype is empty")
    return list(dict.fromkeys(dtypes))


def parse_temperatures(value: str) -> list[float]:
    temps = []
    for t in split_list(value):
        try:
            x = float(t)
        except ValueError:
            raise CliError(f"bad temperature {t!r}; use a comma list of numbers (0 = greedy)") from None
        if not x >= 0:
            raise CliError(f"temperature must be >= 0, got {t}")
        temps.append(x)
    if not temps:
        raise CliError("--temperature is empty")
    return list(dict.fromkeys(temps))


def check_numbers(args) -> None:
    """The numeric arguments' ranges, checked before anything is loaded."""
    if args.max_new_tokens < 1:
        raise CliError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.limit is not None and args.limit < 1:
        raise CliError(f"--limit must be >= 1, got {args.limit}")
    if args.threads is not None and args.threads < 1:
        raise CliError(f"--threads must be >= 1, got {args.threads}")
    if args.warmup < 0:
        raise CliError(f"--warmup must be >= 0, got {args.warmup}")
    if not 0 < args.top_p <= 1 or args.top_k < 0:
        raise CliError("--top-p must be in (0, 1] and --top-k >= 0")
    if args.resume and not args.out:
        raise CliError("--resume needs --out: the report whose runs file to continue")


def add_bench_args(p) -> None:
    add_model_args(p)
    # --dtype takes a comma list here (the parser resolves the conflict with add_model_args' single choice).
    p.add_argument("--dtype", default="auto",
                   help="comma list of fp32, bf16, fp16 (the target loads once each); 'auto' (the default): fp32, and "
                        "bf16 where it measures faster on this machine")
    p.add_argument("--ngram", default="default",
                   help="'default' (the shipped assets/ table, else one built once into the user cache: ~1 min), "
                        "'none', an n-gram .npz or .trie file, or a hub file as repo:file")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma list of {', '.join(METHODS)}")
    p.add_argument("--workloads", default=None,
                   help="comma list of mtbench, humaneval (default: both, or none when --prompts is given)")
    p.add_argument("--prompts", default=None, help="a jsonl file with a 'prompt' field a line (bad lines skipped)")
    p.add_argument("--limit", type=int, default=None, help="prompts per workload at most")
    p.add_argument("--thinking", action="store_true", help=THINKING_HELP)
    p.add_argument("--max-new-tokens", type=int, default=128, help="per prompt and method")
    p.add_argument("--temperature", default="0,0.7", help="comma list; 0 = greedy (default: 0,0.7)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0, help="sampling seed of the first prompt (then +1 a prompt)")
    p.add_argument("--pld-tokens", type=int, default=10, help="prompt lookup: draft tokens (pld, hf_pld, dart_pld)")
    p.add_argument("--pld-ngram", type=int, default=3, help="prompt lookup: longest n-gram matched")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    p.add_argument("--warmup", type=int, default=1, help="prompts decoded untimed per dtype before the run")
    p.add_argument("--out", default=None, help="the JSON report (default runs/bench-DATE-TIME.json)")
    p.add_argument("--resume", action="store_true",
                   help="continue the runs recorded in the runs file next to --out (OUT.runs.jsonl, written as "
                        "runs finish): skip those, run the rest, report all; the settings must be the same")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-candidates", action="store_true",
                   help="DART's steps keep their tree, not the columns every candidate the search weighed is made from "
                        "when read (the app and traces read it; the bench does not, nor does it make it)")
    add_search_args(p)
