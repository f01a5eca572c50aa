"""Per-browser-session data (kept in a `gr.State`), and the store that frees it.

A public Space serves visitors for days from one process, so nothing a visitor leaves may stay for good: a session is
freed (its lanes dropped, its trace and report folders deleted) when its page closes, when it has been idle for
`DART_LAB_SESSION_TTL` seconds, or when more than `DART_LAB_MAX_SESSIONS` are held (the least recently used idle one
first). A running session is never freed. A page whose session was freed gets a fresh one and is told why.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dart_core.errors import ConfigError
from dart_core.methods import DART, LANE_ORDER

from .lanes import Lane

# 20 minutes idle: longer than any pause while reading one run (every step picked or button pressed restarts it),
# short enough that at 1,000 visitors a day (about 3 a minute at a busy hour) some 60 idle sessions are held at most,
# most pages being closed (and freed) sooner.
DEFAULT_TTL_S = 1200.0
# At most this many at once: a session of a 128-token run (plain and DART) holds about 10 MB with Gradio's own page
# data (measured by scripts/soak.py, see the README), so 64 keep well under 1 GB of a Space's 16 GB.
DEFAULT_MAX_SESSIONS = 64
TTL_ENV, MAX_ENV = "DART_LAB_SESSION_TTL", "DART_LAB_MAX_SESSIONS"


def _ended() -> threading.Event:
    """A session's run_ended before its first run: set, as no run is going."""
    event = threading.Event()
    event.set()
    return event


@dataclass
class Session:
    lanes: dict[str, Lane] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    follow: bool = True          # the step view follows the newest step while generating
    skip_plain: bool = True      # following and Prev / Next pass over the steps without a tree (app.step_pick)
    run_ended: threading.Event = field(default_factory=_ended)   # clear while a run goes (running)
    trace_folder: str | None = None  # where the latest downloadable traces were written (one folder per session)
    report_folder: str | None = None  # where the latest exported HTML report was written
    key: str = field(default_factory=lambda: uuid.uuid4().hex)
    last_used: float = field(default_factory=time.monotonic)
    freed: str = ""              # why the store freed it ("" while it is held)

    @property
    def running(self) -> bool:
        return not self.run_ended.is_set()

    @running.setter
    def running(self, value: bool) -> None:
        if value:
            self.run_ended.clear()
        else:
            self.run_ended.set()

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

    def free(self, why: str) -> None:
        """Drop everything the session holds: its lanes, and its folders on disk."""
        self.stop.set()
        self.lanes = {}
        for folder in (self.trace_folder, self.report_folder):
            if folder:
                shutil.rmtree(folder, ignore_errors=True)
        self.trace_folder = self.report_folder = None
        self.freed = why


def _env_number(name: str, default: float, minimum: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum:g}, got {raw!r}")
    return value


class SessionStore:
    """The sessions held, least recently used first. `resume` is called by every event; a background sweep frees
    idle sessions even when no event comes."""

    def __init__(self, ttl_s: float = DEFAULT_TTL_S, max_sessions: int = DEFAULT_MAX_SESSIONS, clock=time.monotonic):
        self.ttl_s, self.max_sessions, self.clock = ttl_s, max_sessions, clock
        self._held: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()
        self.freed = {"closed": 0, "idle": 0, "cap": 0}
        # called with each session freed (the app drops Gradio's copy of its page then: app.ui.forget_page_copy)
        self.on_free: Callable[[Session], None] | None = None

    @classmethod
    def from_env(cls) -> "SessionStore":
        """DART_LAB_SESSION_TTL (seconds idle) and DART_LAB_MAX_SESSIONS, or the defaults above."""
        return cls(_env_number(TTL_ENV, DEFAULT_TTL_S, 1), int(_env_number(MAX_ENV, DEFAULT_MAX_SESSIONS, 1)))

    def open(self, key: str | None = None) -> Session:
        """A new session, held (key: the page's own id, so that closing the page frees it)."""
        session = Session(key=key) if key else Session()
        return self._hold(session)

    def resume(self, session: Session | None) -> tuple[Session, str]:
        """The event's session, marked as used now: (session, why it had been freed, or ""). A freed session is held
        again, empty; None (a page whose state Gradio dropped) becomes a new session."""
        if session is None:
            return self.open(), ""
        why, session.freed = session.freed, ""
        return self._hold(session), why

    def touch(self, session: Session) -> None:
        """The session was used now."""
        session.last_used = self.clock()

    def close(self, key: str) -> None:
        """The page closed: free its session now (unless it runs; the sweep frees it once idle)."""
        with self._lock:
            session = self._held.get(key)
            if session is not None and not session.running:
                self._free(session, "closed")

    def sweep(self) -> None:
        """Free the sessions idle for longer than the TTL, then the least recently used beyond the cap."""
        now = self.clock()
        with self._lock:
            for session in list(self._held.values()):
                if not session.running and now - session.last_used > self.ttl_s:
                    self._free(session, "idle")
            idle = [s for s in self._held.values() if not s.running]
            for session in idle[: max(0, len(self._held) - self.max_sessions)]:
                self._free(session, "cap")

    def start_sweeping(self, after_freeing=None) -> threading.Thread:
        """Sweep in the background, a few times per TTL (at least once a minute); `after_freeing()` runs after a
        sweep that freed a session."""
        interval = min(60.0, self.ttl_s / 4)

        def loop():
            seen = 0
            while True:
                time.sleep(interval)
                self.sweep()
                freed = sum(self.freed.values())   # by this sweep, or by the cap since the last one
                if after_freeing is not None and freed > seen:
                    after_freeing()
                seen = freed
        thread = threading.Thread(target=loop, name="dart-lab-session-sweep", daemon=True)
        thread.start()
        return thread

    def stats(self) -> dict:
        """What the store holds now, and how many sessions it freed and why."""
        with self._lock:
            held = list(self._held.values())
        folders = [Path(f) for s in held for f in (s.trace_folder, s.report_folder) if f]
        return {"sessions": len(held), "running": sum(s.running for s in held),
                "folders": sum(f.is_dir() for f in folders), "freed": dict(self.freed), "ttl_s": self.ttl_s,
                "max_sessions": self.max_sessions}

    def _hold(self, session: Session) -> Session:
        with self._lock:
            self.touch(session)
            self._held[session.key] = session
            self._held.move_to_end(session.key)
        if len(self._held) > self.max_sessions:
            self.sweep()
        return session

    def _free(self, session: Session, why: str) -> None:
        session.free(why)
        del self._held[session.key]
        self.freed[why] += 1
        if self.on_free is not None:
            self.on_free(session)


def freed_text(why: str, ttl_s: float) -> str:
    """What a page whose session was freed is told (its run is gone; a download or export is the way to keep one)."""
    reason = {"idle": f"it was idle for over {ttl_s / 60:.0f} minutes",
              "cap": "the app holds a limited number of sessions and this one was the least recently used",
              "closed": "its page was closed"}.get(why, why)
    return (f"This page's run was freed because {reason}. Run a prompt again, or upload a saved trace "
            "(download the traces or export the HTML to keep a run).")
