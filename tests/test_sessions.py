"""Sessions that expire: idle ones are freed after the TTL with their folders, the store never holds more than its cap
(least recently used first, never a running one), a closed page frees its session, a page whose session was freed
is told so and goes on with an empty one; the environment sets the TTL and the cap, with a clear error if wrong."""

from __future__ import annotations

import threading

import pytest

from app.callbacks import Callbacks
from app.session import DEFAULT_MAX_SESSIONS, DEFAULT_TTL_S, MAX_ENV, TTL_ENV, SessionStore
from dart_core.errors import ConfigError
from tests.app_fixtures import tiny_engine
from tests.app_fixtures import run_request


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def with_folder(store: SessionStore, tmp_path, name: str):
    session = store.open()
    folder = tmp_path / name
    folder.mkdir()
    (folder / "trace.json").write_text("{}")
    session.trace_folder = str(folder)
    return session, folder


def test_idle_sessions_are_freed_with_their_folders(tmp_path):
    clock = Clock()
    store = SessionStore(ttl_s=60, max_sessions=10, clock=clock)
    (a, fa), (b, fb), (c, fc) = (with_folder(store, tmp_path, n) for n in "abc")
    c.running = True
    clock.now += 50
    store.resume(b)                                  # b is used again: its idle time starts over
    clock.now += 20
    store.sweep()
    assert store.stats()["sessions"] == 2 and store.freed["idle"] == 1
    assert not fa.exists() and a.lanes == {} and a.freed == "idle"
    assert fb.exists() and fc.exists()               # used 20 s ago; running (never freed while it runs)
    c.running = False
    clock.now += 61
    store.sweep()
    assert store.stats() == {**store.stats(), "sessions": 0, "folders": 0}
    assert not fb.exists() and not fc.exists() and store.freed == {"closed": 0, "idle": 3, "cap": 0}


def test_the_cap_frees_the_least_recently_used_idle_sessions(tmp_path):
    clock = Clock()
    store = SessionStore(ttl_s=3600, max_sessions=3, clock=clock)
    sessions = []
    for name in "abcde":
        clock.now += 1
        sessions.append(with_folder(store, tmp_path, name))
        if name == "a":
            sessions[0][0].running = True            # the oldest runs: the next oldest go instead
        assert store.stats()["sessions"] <= 3
    held = {s.key for s, _ in sessions if not s.freed}
    assert held == {sessions[i][0].key for i in (0, 3, 4)} and store.freed["cap"] == 2
    assert [f.exists() for _, f in sessions] == [True, False, False, True, True]


def test_a_closed_page_frees_its_session_and_a_freed_one_comes_back_empty(tmp_path):
    store = SessionStore(ttl_s=3600, max_sessions=5)
    session, folder = with_folder(store, tmp_path, "page")
    store.close("no such page")
    assert store.stats()["sessions"] == 1
    page = store.open(key="page-hash")
    store.close("page-hash")
    assert page.freed == "closed" and store.stats()["sessions"] == 1
    store.close(session.key)
    assert not folder.exists() and store.stats()["sessions"] == 0
    again, why = store.resume(session)
    assert again is session and why == "closed" and again.freed == "" and store.stats()["sessions"] == 1
    assert store.resume(again) == (again, "")        # told once
    fresh, why = store.resume(None)                  # a page whose state Gradio dropped
    assert fresh is not session and why == "" and store.stats()["sessions"] == 2


def test_the_environment_sets_the_ttl_and_the_cap(monkeypatch):
    monkeypatch.delenv(TTL_ENV, raising=False)
    monkeypatch.delenv(MAX_ENV, raising=False)
    store = SessionStore.from_env()
    assert (store.ttl_s, store.max_sessions) == (DEFAULT_TTL_S, DEFAULT_MAX_SESSIONS)
    monkeypatch.setenv(TTL_ENV, "90")
    monkeypatch.setenv(MAX_ENV, "7")
    store = SessionStore.from_env()
    assert (store.ttl_s, store.max_sessions) == (90.0, 7)
    for name, bad in ((TTL_ENV, "ten"), (TTL_ENV, "0"), (MAX_ENV, "-1")):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ConfigError, match=name):
            SessionStore.from_env()
        monkeypatch.setenv(name, "5")


def test_a_page_whose_run_was_freed_is_told_why_and_can_run_again(tmp_path):
    clock = Clock()
    store = SessionStore(ttl_s=600, max_sessions=4, clock=clock)
    cb = Callbacks(tiny_engine(), tmp_path, store)
    session = store.open()
    list(cb.run(session, run_request("hello", max_new_tokens=6)))
    folder = session.trace_folder
    assert session.lanes and folder and (tmp_path / folder).exists()
    clock.now += 601
    store.sweep()
    assert not session.lanes and not (tmp_path / folder).exists() and store.stats()["sessions"] == 0
    view = cb.pick_step(session, "dart", 1)
    assert "idle for over 10 minutes" in view["message"] and store.stats()["sessions"] == 1
    assert "freed" not in cb.pick_step(session, "dart", 1).get("message", "")
    list(cb.run(session, run_request("hello", max_new_tokens=6)))
    assert session.lanes["dart"].trace.output_ids == session.lanes["vanilla"].trace.output_ids


def test_a_run_longer_than_the_ttl_keeps_its_session_and_starts_its_idle_time_at_the_end(tmp_path):
    clock = Clock()
    store = SessionStore(ttl_s=60, max_sessions=4, clock=clock)
    cb = Callbacks(tiny_engine(), tmp_path, store)
    session = store.open()
    updates = cb.run(session, run_request("hello", max_new_tokens=6))
    next(updates)
    clock.now += 600                                 # a run of ten minutes: never freed while it runs
    store.sweep()
    assert session.running and not session.freed
    list(updates)
    store.sweep()                                    # idle since the run ended, not since it started
    assert not session.freed and session.trace_folder and (tmp_path / session.trace_folder).exists()
    clock.now += 61
    store.sweep()
    assert session.freed == "idle"


def test_the_background_sweep_frees_idle_sessions_and_then_gives_memory_back(tmp_path):
    store = SessionStore(ttl_s=0.2, max_sessions=4)
    _, folder = with_folder(store, tmp_path, "idle")
    given_back = threading.Event()
    store.start_sweeping(after_freeing=given_back.set)
    assert given_back.wait(5.0) and not folder.exists() and store.stats()["sessions"] == 0


def test_a_freed_session_takes_gradios_copy_of_its_page_along(tmp_path, monkeypatch):
    """Gradio keeps, per page, every component's configuration with its latest value, and a copy of the components a
    streamed run updated (about 2.8 MB a page on the tiny model), until newer pages push it out. Once the store frees a
    page's session that copy goes; the page still learns why its run is gone when it comes back."""
    from gradio_client import Client

    from app.ui import build_app, launch_kwargs
    from scripts.app_server import free_port

    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "False")
    clock = Clock()
    store = SessionStore(ttl_s=600, max_sessions=4, clock=clock)
    demo = build_app(tiny_engine(), trace_dir=tmp_path, sessions=store)
    demo.queue()
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                **launch_kwargs(store))
    client = Client(f"http://127.0.0.1:{port}/", verbose=False, download_files=False)
    try:
        client.predict(*run_request("hello", max_new_tokens=8).values(), api_name="/page_run")
        page = demo.state_holder.session_data[client.session_hash]
        own = set(demo.blocks)
        assert len(page.config_values) > 50 and set(page.blocks_config.blocks) - own   # what a run leaves held
        clock.now += 601
        store.sweep()
        assert store.stats()["sessions"] == 0
        assert not page.config_values and set(page.blocks_config.blocks) <= own
        _, message = client.predict(api_name="/export_html")    # the page's next event, on its freed session
        assert "idle for over 10 minutes" in message
    finally:
        client.close()
        demo.close()
