"""The HTML report of a run (dart_core.views.report, `python -m dart_core report`, the app's Export): one file
holding every lane's text, one story per step, each DART step's tree as figure JSON, the run's charts and the
missed-token forensics, with plotly.js inlined once and nothing loaded from elsewhere."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
from plotly.offline import get_plotlyjs

from app.callbacks import Callbacks
from app.engine import Engine
from app.session import Session, SessionStore
from app.ui import launch_kwargs
from dart_core.methods import LANES, lane_of
from dart_core.tools.cli import main
from dart_core.views.report import ReportError, report_html
from dart_core.views import figures
from dart_core.views.text_render import token_text
from dart_core.ngram import NGramModel
from tests.app_fixtures import TRICKY, hand_trace, tiny_traces


class Page(HTMLParser):
    """What a browser would see: the attributes that load things, the lanes' texts, the steps and their parts."""

    def __init__(self, text: str):
        super().__init__()
        self.links: list[str] = []           # every src= and href=
        self.pre: list[str] = []             # the text of each <pre class="lane-text">
        self.stories: dict[str, int] = {}    # step id -> stories in it
        self.trees: dict[str, dict] = {}     # tree id -> its figure
        self.autoplays: dict[str, dict] = {}  # autoplay id -> its animated figure
        self.scripts: list[str] = []         # inline scripts
        self.steps: list[str] = []
        self._in, self._step, self._json = None, None, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.links += [v for k, v in attrs if k in ("src", "href") and v]
        classes = (a.get("class") or "").split()
        if tag == "details" and "step" in classes:
            self._step = a["id"]
            self.steps.append(a["id"])
            self.stories[a["id"]] = 0
        if tag == "ol" and "step-story" in classes:
            self.stories[self._step] += 1
        if tag == "pre" and "lane-text" in classes:
            self._in = "pre"
            self.pre.append("")
        if tag == "script":
            self._in = "script"
            self._json = a.get("id") if a.get("type") == "application/json" else None
            self.scripts.append("")

    def handle_endtag(self, tag):
        if tag in ("pre", "script"):
            if tag == "script" and self._json and self._json.startswith("tree-"):
                self.trees[self._json] = json.loads(self.scripts.pop())
            elif tag == "script" and self._json and self._json.startswith("autoplay-"):
                self.autoplays[self._json] = json.loads(self.scripts.pop())
            self._in = self._json = None
        if tag == "details":
            self._step = None

    def handle_data(self, data):
        if self._in == "pre":
            self.pre[-1] += data
        elif self._in == "script":
            self.scripts[-1] += data


@pytest.fixture(scope="module")
def traces():
    return tiny_traces(16)


@pytest.fixture(scope="module")
def report(traces):
    return report_html(list(traces.values()))


def test_the_report_holds_the_whole_run(traces, report):
    page = Page(report)
    for trace in traces.values():   # each lane's text, as written
        assert "".join(token_text(trace, t) for t in trace.output_ids) in page.pre
    # One story per step of every lane, inside that step.
    assert page.steps == [f"step-{lane_of(t.method)}-{i}" for t in traces.values() for i in range(len(t.steps))]
    assert all(n == 1 for n in page.stories.values())
    # A tree per DART step, drawn from its own figure JSON; plain decoding's trivial trees are left out.
    dart = traces["dart"]
    assert {k for k in page.trees if k.startswith("tree-dart-")} == {f"tree-dart-{i}" for i in range(1, len(dart.steps))}
    assert not any(k.startswith("tree-vanilla-") for k in page.trees)
    for key, fig in page.trees.items():
        step = int(key.rsplit("-", 1)[1])
        assert fig["layout"]["title"]["text"].startswith(f"Step {step}:")
        assert any(t.get("mode") == "markers+text" for t in fig["data"])
    # The run's charts and the forensics, drawn on load; the budgets' effects also as a table.
    drawn = [s for s in page.scripts if "Plotly.newPlot" in s]
    for title in ("Accepted draft tokens per step", "Acceptance per draft position", "Why tokens were missed"):
        assert any(title in s for s in drawn), title
    assert 'class="knob-effects"' in report and 'class="miss-reasons"' in report


def test_the_report_autoplays_each_drafting_lane(traces, report):
    page = Page(report)
    assert set(page.autoplays) == {"autoplay-dart", "autoplay-pld"}     # plain decoding drafts nothing to play
    for key, fig in page.autoplays.items():
        trace = traces[key.split("-")[1]]
        assert [f["name"] for f in fig["frames"]] == [f"step {i}" for i in range(len(trace.steps))]
        assert fig["layout"]["updatemenus"][0]["buttons"][0]["label"] == "▶ Play"
    assert "frames: fig.frames" in report     # opening it draws the figure with its frames


def test_the_report_is_self_contained(report):
    assert report.count(get_plotlyjs()) == 1
    page = Page(report)
    assert not [link for link in page.links if link.startswith(("http://", "https://", "//"))]
    assert "<script src" not in report and "<link" not in report
    # Token text from the model is data everywhere, in the HTML and in the embedded JSON alike.
    assert TRICKY[9] not in report and TRICKY[8] not in report


def test_the_report_and_the_app_colour_each_lane_as_its_charts(report):
    # Each lane's card has the colour its bars have in the charts, in the report and on the app's page alike.
    bars = {bar.name: bar.marker.color for bar in figures.accepted_length_figure(tiny_traces(4)).data}
    page_css = launch_kwargs(SessionStore())["css"]
    for key, look in LANES.items():
        rule = f".lane-{key} {{ border-top: 4px solid {look.colour}; }}"
        assert rule in report and rule in page_css
        assert bars.get(look.short, look.colour) == look.colour   # plain decoding has no bars


def test_a_report_needs_one_trace_per_lane(traces):
    with pytest.raises(ReportError, match="no trace"):
        report_html([])
    with pytest.raises(ReportError, match="one per lane"):
        report_html([traces["dart"], hand_trace()])


def test_the_command_writes_the_report_and_refuses_bad_traces(traces, tmp_path, capsys):
    paths = []
    for name in ("vanilla", "dart"):
        paths.append(tmp_path / f"{name}.json.gz")
        traces[name].save(paths[-1])
    out = tmp_path / "out" / "run.html"
    assert main(["report", *map(str, paths), "--out", str(out), "--title", "two lanes"]) == 0
    text = out.read_text(encoding="utf-8")
    assert "<title>two lanes</title>" in text and text.count('class="step-story"') == sum(
        len(traces[n].steps) for n in ("vanilla", "dart"))
    # The trace names no n-gram table: the search replays wait for one (--ngram), and the report says so.
    assert "<td>beam width 10</td>" not in text and "the run&#x27;s n-gram table is not loaded" in text
    table = tmp_path / "table.npz"
    NGramModel.build([list(range(3, 90)), [5, 6, 7, 8, 9] * 4], vocab_size=96, order=3).save(table)
    assert main(["report", *map(str, paths), "--out", str(out), "--ngram", str(table)]) == 0
    assert "<td>beam width 10</td>" in out.read_text(encoding="utf-8")
    capsys.readouterr()
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    broken = tmp_path / "broken.json"
    d = hand_trace().to_dict()
    d["steps"][1]["index"] = 7
    broken.write_text(json.dumps(d))
    for args in ([str(bad)], [str(tmp_path / "missing.json")], [str(broken)], [str(paths[0]), str(paths[0])]):
        assert main(["report", *args, "--out", str(tmp_path / "x.html")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "x.html").exists()
    assert main(["report", str(paths[0]), "--out", str(tmp_path)]) == 2   # a folder


def test_the_app_exports_the_sessions_lanes(tmp_path):
    cb = Callbacks(Engine(), tmp_path)
    session = Session()
    out = cb.export_html(session)                 # nothing run yet: a message, no file
    assert out["export"] is None and "no run to export" in out["message"]
    path = tmp_path / "hand.json"
    hand_trace().save(path)
    cb.upload(session, [str(path)])
    out = cb.export_html(session)
    page = Page(open(out["export"], encoding="utf-8").read())
    assert set(page.trees) == {"tree-dart-1"} and list(page.stories.values()) == [1, 1]
    first = out["export"]
    assert cb.export_html(session)["export"] != first and not Path(first).exists()   # only the latest kept
