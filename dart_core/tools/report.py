"""`python -m dart_core report TRACE... --out run.html`: one self-contained HTML file of a run, to share (it opens
offline in a browser; see dart_core.views.report)."""

from __future__ import annotations

from pathlib import Path

from ..setup.files import check_writable, write_atomic
from ..trace import Trace, TraceError, check_trace
from ..views.report import report_html


def register(sub) -> None:
    r = sub.add_parser("report", help="write one self-contained HTML file of a run from its traces")
    r.add_argument("traces", nargs="+", metavar="TRACE",
                   help="trace files (.json or .json.gz, one per lane: say a DART run and a plain one)")
    r.add_argument("--out", required=True, help="the HTML file to write")
    r.add_argument("--title", default=None, help="the report's title (default: the traces' prompt)")
    r.set_defaults(handler=cmd_report)


def cmd_report(args) -> int:
    out = check_writable(args.out)
    traces = []
    for path in args.traces:
        trace = Trace.load(path)
        try:
            check_trace(trace)
        except TraceError as exc:   # say which of the files it is
            raise TraceError(f"{path}: {exc}") from None
        traces.append(trace)
    text = report_html(traces, args.title)
    size = write_atomic(out, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    print(f"wrote {out} ({size / 1e6:.1f} MB, {len(traces)} lane{'s' if len(traces) > 1 else ''})")
    return 0

