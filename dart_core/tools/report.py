"""`python -m dart_core report TRACE... --out run.html`: one self-contained HTML file of a run, to share (it opens
offline in a browser; see dart_core.views.report)."""

from __future__ import annotations

from pathlib import Path

from ..errors import DartError
from ..ngram import NGramModel
from ..setup.files import check_writable, write_atomic
from ..setup.loading import load_ngram
from ..trace import Trace, TraceError, check_trace


def register(sub) -> None:
    r = sub.add_parser("report", help="write one self-contained HTML file of a run from its traces")
    r.add_argument("traces", nargs="+", metavar="TRACE",
                   help="trace files (.json or .json.gz, one per lane: say a DART run and a plain one)")
    r.add_argument("--out", required=True, help="the HTML file to write")
    r.add_argument("--title", default=None, help="the report's title (default: the traces' prompt)")
    r.add_argument("--ngram", default=None,
                   help="the DART run's n-gram table, to replay its search for the forensics (n-gram weight, beam "
                        "width); default: the table the trace names, where it is on this machine; 'none': no replays")
    r.set_defaults(handler=cmd_report)


def cmd_report(args) -> int:
    report_html = _views()
    out = check_writable(args.out)
    traces = []
    for path in args.traces:
        trace = Trace.load(path)
        try:
            check_trace(trace)
        except TraceError as exc:   # say which of the files it is
            raise TraceError(f"{path}: {exc}") from None
        traces.append(trace)
    text = report_html(traces, args.title, _replay_table(args.ngram, traces))
    size = write_atomic(out, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    print(f"wrote {out} ({size / 1e6:.1f} MB, {len(traces)} lane{'s' if len(traces) > 1 else ''})")
    return 0


def _views():
    """The report's drawing code: imported here, because it needs the app's libraries (plotly, pandas, networkx)
    and the engine's other commands do not."""
    try:
        from ..views.report import report_html
    except ImportError as exc:
        raise DartError(f"the report needs the app's libraries ({exc.name} is missing): "
                        "pip install 'dart-lab[app]'") from None
    return report_html


def _replay_table(spec: str | None, traces: list[Trace]) -> NGramModel | None:
    """The table the DART trace was decoded with (or `spec`), or None with a note where it cannot be had."""
    dart = next((t for t in traces if t.uses_tree_search), None)
    spec = spec or (dart.settings.ngram if dart else None)
    if dart is None or spec in (None, "none"):
        return None
    try:
        return load_ngram(spec)
    except (DartError, OSError) as exc:
        print(f"note: the n-gram table {spec!r} is not loaded ({exc}); the forensics leave out the search replays")
        return None
