"""Command line: `python -m dart_core generate | bench | ngram | train-data | train | report ...`.

A user's mistake (any DartError: a bad argument, a missing file, a head that does not fit) exits with status 2 and
one line on stderr. Anything else is a bug: its traceback is printed and the exit status is 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import DartError
from . import bench, generate, ngram, report, train
from .args import Parser, resolve_model_names


def build_parser() -> Parser:
    installed = Path(sys.argv[0]).name == "dart-lab"     # the command pip installs, or `python -m dart_core`
    parser = Parser(prog="dart-lab" if installed else "python -m dart_core",
                    description="DART speculative decoding engine")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in (generate, bench, ngram, train, report):
        command.register(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    resolve_model_names(args)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except DartError as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"error: {message}", file=sys.stderr)
        return 2
