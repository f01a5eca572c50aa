"""How often a running run's view goes to the page. A fast engine makes hundreds of steps a second: a page redrawn
that often is too busy to answer a click on Stop, and drawing every step took longer than making it (docs/app.md)."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Pace:
    """In seconds: an update at most every `frame_s` (and one as each lane ends), with the step view (tree, table,
    draft rows) and the charts, which cost the browser most, at most every `tree_s` and `chart_s`; and building the
    updates takes at most `busy_share` of the run's time (the charts of a long run take seconds to build)."""
    frame_s: float = 0.25
    tree_s: float = 1.0
    chart_s: float = 2.0
    busy_share: float = 0.2


class Pacer:
    """One run's clock against its Pace: whether an update is due now, and with what."""

    def __init__(self, pace: Pace):
        self.pace = pace
        self.sent_at, self.gap = time.monotonic(), pace.frame_s
        self.tree_at = self.charts_at = float("-inf")   # the first update shows both

    def due(self, now: float, lane_ended: bool) -> bool:
        return lane_ended or now - self.sent_at >= self.gap

    def tree_due(self, now: float, lane_ended: bool) -> bool:
        return lane_ended or now - self.tree_at >= self.pace.tree_s

    def charts_due(self, now: float) -> bool:
        return now - self.charts_at >= self.pace.chart_s

    def sent(self, now: float, tree: bool, charts: bool) -> None:
        """An update begun at `now` was built (with the tree, the charts): the next waits its share of the time."""
        built = time.monotonic() - now
        self.sent_at, self.gap = now, max(self.pace.frame_s, built * (1 / self.pace.busy_share - 1))
        self.tree_at = now if tree else self.tree_at
        self.charts_at = now if charts else self.charts_at
