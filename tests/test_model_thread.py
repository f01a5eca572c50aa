"""The app drives the model from one thread only (app.engine.ModelThread): OpenMP keeps a pool of workers per calling
thread, and pools from several threads make every parallel region slow on a small CPU."""

import threading

from app.engine import MODEL_THREAD, ModelThread


def test_steps_run_on_the_model_thread_and_closing_closes_them_there():
    seen, closed = [], []

    def decode():
        try:
            for i in range(3):
                seen.append(threading.current_thread().name)
                yield i
        finally:
            closed.append(threading.current_thread().name)

    assert list(MODEL_THREAD.steps(decode())) == [0, 1, 2]
    assert set(seen) == set(closed) and all(name.startswith(ModelThread.NAME) for name in seen)
    seen.clear(), closed.clear()
    steps = MODEL_THREAD.steps(decode())
    assert next(steps) == 0
    steps.close()                                  # a lane stopped early: the decode's cleanup runs there too
    assert closed and closed[0].startswith(ModelThread.NAME)


def test_calls_from_any_thread_meet_on_one_thread_and_nest_without_waiting_on_themselves():
    names = []
    workers = [threading.Thread(target=lambda: names.append(MODEL_THREAD.call(
        lambda: threading.current_thread().name))) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(set(names)) == 1 and names[0].startswith(ModelThread.NAME)
    assert MODEL_THREAD.call(lambda: MODEL_THREAD.call(lambda: 7)) == 7


def test_a_runs_lanes_are_made_on_the_model_thread_whoever_asks(monkeypatch):
    """Making a lane's proposer packs the head's weights, and its trace's record may measure the cost curve: both use
    torch's threads, so both happen on the model thread, even for a run asked from another thread."""
    from app.callbacks import Callbacks
    from app.request import RunRequest
    from dart_core.setup.loading import Loaded
    from tests.app_fixtures import tiny_engine

    engine = tiny_engine()
    where = []
    for name in ("proposer", "new_trace"):
        made = getattr(Loaded, name)
        monkeypatch.setattr(Loaded, name, lambda self, *a, _made=made, _name=name, **k: (
            where.append((_name, threading.current_thread().name)), _made(self, *a, **k))[1])
    asker = threading.Thread(target=lambda: Callbacks(engine).new_lanes(RunRequest.named(prompt="hi", max_new_tokens=2)))
    asker.start()
    asker.join()
    assert {name for name, _ in where} == {"proposer", "new_trace"}
    assert all(thread.startswith(ModelThread.NAME) for _, thread in where), where
