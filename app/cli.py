"""`python app.py`: parse the flags, load the engine (or none, for replay), build the app and serve it.

Bad flags, or a model, head, table or trace that cannot be loaded (a DartError), end with one line on stderr and exit
status 2. Anything else is a bug and keeps its traceback (exit status 1).
"""

from __future__ import annotations

import argparse
import os
import sys

from dart_core.errors import DartError
from dart_core.machine.records import AUTO_KERNELS, DRAFT_KERNEL_MODES
from dart_core.tools.args import (DRAFT_HELP, DRAFT_KERNELS_HELP, DTYPE_HELP, HUB_HELP, MODEL_HELP, NGRAM_HELP,
                                  THINKING_HELP, resolve_model_names)
from dart_core.trace import Trace

from .engine import Engine
from .health import trim_malloc
from .session import DEFAULT_MAX_SESSIONS, DEFAULT_TTL_S, MAX_ENV, TTL_ENV, SessionStore

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7860


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python app.py", description="DART Lab: plain decoding vs DART, and every draft tree",
                epilog=f"Sessions: a page's run is freed after {TTL_ENV} seconds idle (default {DEFAULT_TTL_S:.0f}) "
                       f"and beyond {MAX_ENV} sessions held (default {DEFAULT_MAX_SESSIONS}).")
    # Hugging Face Spaces sets GRADIO_SERVER_NAME / GRADIO_SERVER_PORT; flags win over them.
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", DEFAULT_HOST))
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", DEFAULT_PORT)))
    p.add_argument("--share", action="store_true", help="also serve through a public Gradio share link")
    p.add_argument("--model", default="default", help=MODEL_HELP)
    p.add_argument("--draft", default="default", help=DRAFT_HELP + " (a random head if none is shipped)")
    p.add_argument("--ngram", default="default", help=NGRAM_HELP)
    p.add_argument("--hub", action="store_true", help=HUB_HELP)
    p.add_argument("--thinking", action="store_true", help=THINKING_HELP)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto", choices=["auto", "fast", "fp32", "bf16", "fp16"], help=DTYPE_HELP)
    p.add_argument("--draft-kernels", default=AUTO_KERNELS, choices=DRAFT_KERNEL_MODES, help=DRAFT_KERNELS_HELP)
    p.add_argument("--replay", action="store_true", help="load no model: only explore saved traces")
    p.add_argument("--trace", action="append", default=[], metavar="FILE",
                   help="a saved trace every session starts with (repeat for one per lane)")
    return p


def load(args):
    """(engine, preloaded traces) for the parsed flags."""
    traces = [Trace.load(path) for path in args.trace]
    resolve_model_names(args)
    engine = Engine.replay_only(args.ngram) if args.replay else Engine.load(
        args.model, args.draft, args.ngram, args.device, args.dtype, args.draft_kernels)
    engine.thinking = args.thinking
    return engine, traces


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if not 0 < args.port < 65536:
        print(f"error: --port must be in 1..65535, got {args.port}", file=sys.stderr)
        return 2
    try:
        sessions = SessionStore.from_env()
        engine, traces = load(args)
    except DartError as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"error: {message}", file=sys.stderr)
        return 2
    from .ui import build_app, launch_kwargs  # deferred: gradio takes seconds to import, not needed for --help

    for notice in engine.notices:
        print(f"[dart-lab] {notice}", file=sys.stderr)
    demo = build_app(engine, preload=traces, sessions=sessions)
    sessions.start_sweeping(after_freeing=trim_malloc)
    demo.queue(default_concurrency_limit=4)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, show_error=False,
                **launch_kwargs(sessions))
    return 0
