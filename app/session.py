"""Per-browser-session data (kept in a `gr.State`): the lanes of the last run or replay, the stop flag, the view."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from dart_core.methods import DART

from .lanes import LANE_ORDER, Lane


@dataclass
class Session:
    lanes: dict[str, Lane] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    follow: bool = True          # the step view follows the newest step while generating
    running: bool = False
    trace_folder: str | None = None  # where the latest downloadable traces were written (one folder per session)
    report_folder: str | None = None  # where the latest exported HTML report was written

    def new_run(self, lanes: list[Lane]) -> None:
        """Replace the lanes; the previous run (if any still runs) keeps its own stop flag, now set."""
        self.stop.set()
        self.stop = threading.Event()
        self.lanes = {lane.key: lane for lane in sorted(lanes, key=lambda ln: LANE_ORDER.index(ln.key))}
        self.follow = True

    def lane(self, key: str | None) -> Lane | None:
        if key in self.lanes:
            return self.lanes[key]
        return self.lanes.get(DART) or next(iter(self.lanes.values()), None)

    def default_lane(self) -> str | None:
        lane = self.lane(DART)
        return lane.key if lane else None
