"""A small soak of the real app process: short-lived visitors one after another through its API (scripts/soak.py),
on a tiny model. What the app holds stays bounded by its cap while they come (sessions, their folders, Gradio's
pages, the temporary files), and all of it is given back once they are idle for the TTL. RSS is reported (it is
noisy: the bounds are asserted on what the app holds)."""

from __future__ import annotations

import time

from scripts.app_server import serve_app
from scripts.soak import soak
from dart_core.setup.tiny_training import word_tokenizer
from dart_core.setup.tiny_models import tiny_target

# Twelve visitors are three times the sessions held and more than the bound on Gradio's pages (2 * MAX_HELD + 1), so
# anything kept per visitor breaks a bound. Five new tokens make a run of about a second (about 0.1 s a token here):
# several updates of the page (app.pacing.Pace), the first with its charts and trees, as in longer runs; the app's
# time per visitor grows with the tokens.
TTL_S, MAX_HELD, VISITORS, NEW_TOKENS = 3, 4, 12, 5


def test_what_the_app_holds_stays_bounded_and_is_given_back(tmp_path, report):
    model = tmp_path / "model"
    tiny_target("llama").model.save_pretrained(model)
    word_tokenizer().save_pretrained(model)
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {"TMPDIR": str(temp), "GRADIO_TEMP_DIR": str(temp / "gradio"), "DART_CACHE_DIR": str(tmp_path / "cache"),
           "DART_LAB_SESSION_TTL": str(TTL_S), "DART_LAB_MAX_SESSIONS": str(MAX_HELD)}
    with serve_app("--model", str(model), "--draft", "random", "--ngram", "none", env=env,
                   log_path=tmp_path / "app.log") as (url, pid):
        result = soak(url, VISITORS, max_new_tokens=NEW_TOKENS, every=4, pid=pid, temp_dir=str(temp),
                      log=lambda s: None)
        assert result["failures"] == []
        for s in result["samples"]:
            assert s["sessions"] <= MAX_HELD and s["folders"] <= MAX_HELD, s
            assert s["gradio_pages"] <= 2 * MAX_HELD + 1, s          # + the soak's own page
            assert s["temp_mb"] < 2.0, s                                # a few traces of 5 tokens at most
        given_back_by = time.monotonic() + TTL_S + 2                    # idle: the sweep frees everything by then
        while True:
            idle = soak(url, 0, pid=pid, temp_dir=str(temp), log=lambda s: None)["samples"][-1]
            if idle["sessions"] == idle["folders"] == 0 or time.monotonic() > given_back_by:
                break
            time.sleep(0.5)
    assert idle["sessions"] == 0 and idle["folders"] == 0, idle
    first, last = result["samples"][0], result["samples"][-1]
    sessions, temp_mb = (max(s[k] for s in result["samples"]) for k in ("sessions", "temp_mb"))
    report(f"{VISITORS} visitors, RSS {first['rss_mb']} -> {last['rss_mb']} MB, at most {sessions} sessions and "
           f"{temp_mb} MB of temporary files held")
