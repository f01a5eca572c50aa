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
