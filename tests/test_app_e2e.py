"""End to end in a real headless browser: Debian's chromium driven by selenium (no browser download).

Starts `python app.py` (default model, random draft head) on a free port, types a prompt, runs it, waits for both
lanes, checks that the tree is drawn and that the step selector (prev, slider, token click) changes it, plays a
step's animation frame by frame, exports the run as HTML and opens that file from disk, replays an uploaded trace,
and has a second page queue behind a long run (it sees its place), stops the long run, which hands the model to the
queued page, and frees the second page's session when that page is closed. Skips, saying why, only when chromium,
chromedriver or selenium is missing (.ci/run installs them).
"""

from __future__ import annotations

import os
import re
import urllib.request

import pytest

from tests.app_browser import (click, dismiss_tour, element, find_chromium, lane_status, make_driver, open_accordion,
                               run_prompt, serve_app, set_slider, tree_points, tree_title, wait_for)
from tests.app_fixtures import hand_trace

BROWSER, DRIVER, WHY = find_chromium()
# In CI (.ci/run installs chromium) a missing browser is a failure, elsewhere a skip that says why.
pytestmark = pytest.mark.skipif(bool(WHY) and not os.environ.get("CI"),
                                reason=f"end-to-end browser test skipped: {WHY}")

MAX_NEW = 24
LONG_RUN = 512    # tokens of the run that holds the model while a second page queues behind it, until Stop ends it
                  # (the most the page allows: Stop may wait seconds for a busy browser)
# The long run's prompt: its greedy answer runs past 512 tokens (the first prompt's ends at 211, which a fast machine
# could reach before Stop lands).
LONG_PROMPT = "Write a very long story about a dragon, at least two thousand words."
QUEUED_RUN = 8   # tokens of the second page's run: it only has to wait its turn and finish
QUEUE_TEXT = re.compile(r"queue: (\d+)/(\d+)")   # Gradio's status on the queued page's lanes (with the wait)


def title_step(drv) -> int:
    m = re.match(r"Step (\d+):", tree_title(drv))
    assert m, tree_title(drv)
    return int(m.group(1))


def test_run_explore_and_replay_in_a_browser(tmp_path):
    if WHY:
        pytest.fail(f"CI must run the browser test, but {WHY}")
    from selenium.webdriver.common.by import By

    with serve_app("--draft", "random", "--ngram", "none", log_path=tmp_path / "app.log") as (url, _):
        drv = make_driver(BROWSER, DRIVER, 1500, 1400)
        try:
            drv.get(url)
            dismiss_tour(drv)
            open_accordion(drv, "Sampling")
            set_slider(drv, "max-new-tokens", MAX_NEW)
            run_prompt(drv, "Write a Python function that adds two numbers.", timeout=240)

            # Both lanes wrote the same greedy answer; DART's text marks token origins.
            plain = element(drv, "#lane-vanilla .lane-text").text
            dart = element(drv, "#lane-dart .lane-text").text
            assert plain and plain == dart
            tokens = drv.find_elements(By.CSS_SELECTOR, "#lane-dart .tok")
            assert len(tokens) == MAX_NEW
            assert "tok/s" in element(drv, "#lane-dart .lane-stats").text
            assert drv.find_element(By.CSS_SELECTOR, "#message").text == ""

            # The tree of the newest step is drawn: one marker per node (+ the bonus token).
            last = wait_for(drv, lambda d: title_step(d) > 0 and title_step(d), 30, "the tree of the last step")
            assert tree_points(drv) >= 2
            drv.save_screenshot(str(tmp_path / "after-run.png"))

            # Prev, the slider and a click on a token each change the tree shown; Prev passes over the steps without a
            # tree (plain decoding: the root and the target's token alone), as the page's box asks by default.
            click(drv, "#prev-btn", "the Prev button")
            earlier = wait_for(drv, lambda d: title_step(d) < last and title_step(d) + 1, 30, "an earlier tree") - 1
            assert earlier == 0 or tree_points(drv) >= 3
            set_slider(drv, "step-slider", 2)
            wait_for(drv, lambda d: title_step(d) == 2, 30, "step 2's tree")
            token = wait_for(drv, lambda d: d.find_elements(By.CSS_SELECTOR, "#lane-dart .tok")[5], 30, "a token")
            clicked = int(token.get_attribute("data-step"))
            token.click()
            wait_for(drv, lambda d: title_step(d) == clicked, 30, f"step {clicked}'s tree after a token click")
            before = tree_points(drv)
            click(drv, "#show-pruned input", "the pruned candidates checkbox")
            wait_for(drv, lambda d: tree_points(d) > before, 30, "the pruned candidates")
            drv.save_screenshot(str(tmp_path / "explore.png"))

            # Animate: the selected step is drawn with its frames, which play in the browser one by one.
            open_accordion(drv, "Animate")
            click(drv, "#animate-btn", "the Animate step button")
            wait_for(drv, lambda d: d.execute_script(
                "const g = document.querySelector('#animation-plot .anim-plot');"
                "return g && g._transitionData && g._transitionData._frames.length > 2"), 60, "the step's animation")
            drv.execute_script(
                "const g = document.querySelector('#animation-plot .anim-plot'); window.__played = [];"
                "g.on('plotly_animatingframe', e => window.__played.push(e.name));"
                "window.Plotly.animate(g, null, {frame: {duration: 50, redraw: true}, transition: {duration: 0},"
                " mode: 'immediate'});")
            names = drv.execute_script(
                "return document.querySelector('#animation-plot .anim-plot')._transitionData._frames.map(f => f.name)")
            wait_for(drv, lambda d: d.execute_script("return window.__played.length") >= len(names), 30,
                     "every frame of the animation played")
            assert drv.execute_script("return window.__played") == names
            assert names[0] == "rows" and names[-1] == "accepted"
            drv.save_screenshot(str(tmp_path / "animation.png"))

            # Export: the run as one HTML file, which opens from disk with no server and draws a step's tree.
            open_accordion(drv, "Traces")
            click(drv, "#export-btn", "the Export HTML button")
            link = wait_for(drv, lambda d: d.find_element(By.CSS_SELECTOR, "#export-file a[href]"), 60,
                            "the exported file")
            report = tmp_path / "run.html"
            with urllib.request.urlopen(link.get_attribute("href"), timeout=30) as r:
                report.write_bytes(r.read())
            app_tab = drv.current_window_handle
            drv.switch_to.new_window("tab")
            drv.get(report.as_uri())
            step = element(drv, "details.step[data-tree] > summary", "the report's steps")
            drv.execute_script("arguments[0].scrollIntoView()", step)
            step.click()
            wait_for(drv, lambda d: d.find_elements(By.CSS_SELECTOR, "details[open] .tree.js-plotly-plot .point"), 30,
                     "a tree drawn in the report")
            assert element(drv, "details[open] .step-story").text
            assert len(drv.find_elements(By.CSS_SELECTOR, ".lane-vanilla, .lane-dart")) == 2   # both lanes
            drv.save_screenshot(str(tmp_path / "report.png"))
            drv.close()
            drv.switch_to.window(app_tab)

            # Replay: upload a saved trace; its lane and tree replace the run.
            path = tmp_path / "hand-trace.json"
            hand_trace().save(path)
            open_accordion(drv, "Traces")
            upload = wait_for(drv, lambda d: d.find_element(By.CSS_SELECTOR, "#upload input[type=file]"), 30,
                              "the upload box")   # a file input is hidden: present is enough
            upload.send_keys(str(path))
            wait_for(drv, lambda d: "Loaded" in d.find_element(By.CSS_SELECTOR, "#message").text, 60,
                     "the replay message")
            wait_for(drv, lambda d: title_step(d) == 1, 30, "the replayed tree")
            status = element(drv, "#lane-dart .lane").get_attribute("data-status")
            assert status.startswith("replay")
            # Token text with markup is shown as text everywhere (the hand trace has the token "<b>bold</b>").
            assert not drv.find_elements(By.CSS_SELECTOR, "#lane-dart b, #tree-plot b, #step-info b b")
            wait_for(drv, lambda d: next(b for b in d.find_elements(By.CSS_SELECTOR, "button[role=tab]")
                                         if "Pruning" in b.text).click() or True, 30, "the Pruning tab")
            wait_for(drv, lambda d: any(c.text == "<b>bold</b>" for c in d.find_elements(By.CSS_SELECTOR,
                                                                                         "#prune-table .body-cell")),
                     30, "the pruning table with the escaped token")
            drv.save_screenshot(str(tmp_path / "replay.png"))

            # A second visitor who presses Run while the first one's run holds the model sees their place in the
            # queue and the wait on the lanes; closing that page frees its session at once.
            other = make_driver(BROWSER, DRIVER, 1500, 1400)
            try:
                other.get(url)
                dismiss_tour(other)
                element(other, "#prompt textarea", "the second page's prompt box").send_keys("Name three colours.")
                open_accordion(other, "Sampling")
                set_slider(other, "max-new-tokens", QUEUED_RUN)
                set_slider(drv, "max-new-tokens", LONG_RUN)
                run_prompt(drv, LONG_PROMPT, wait=False)
                wait_for(drv, lambda d: lane_status(d, "dart").startswith("running"), 60, "the long run to run")
                click(other, "#run-btn", "the second page's Run button")
                queued = wait_for(other, lambda d: QUEUE_TEXT.search(d.find_element(By.CSS_SELECTOR, "#lanes").text),
                                  60, "the queue position on the second page")
                other.save_screenshot(str(tmp_path / "queued.png"))
                assert int(queued.group(1)) >= 1 and int(queued.group(2)) >= int(queued.group(1))
                # Stop ends the long run after its step in flight and hands the model to the queued page.
                click(drv, "#stop-btn", "the Stop button")
                wait_for(drv, lambda d: all(lane_status(d, k).startswith("stopped") for k in ("vanilla", "dart")), 60,
                         "the long run's lanes to say stopped")
                assert len(drv.find_elements(By.CSS_SELECTOR, "#lane-dart .tok")) < LONG_RUN
                wait_for(other, lambda d: all(lane_status(d, k).startswith("done") for k in ("vanilla", "dart")), 240,
                         "the second page's run")
                assert "queue:" not in other.find_element(By.CSS_SELECTOR, "#lanes").text
                assert len(other.find_elements(By.CSS_SELECTOR, "#lane-dart .tok")) <= QUEUED_RUN
            finally:
                other.quit()
            wait_for(drv, lambda d: app_health(url)["freed"]["closed"] >= 1, 60, "the closed page's session freed")
        except Exception as exc:   # what the page and the app said, for a failure that happens only now and then
            exc.add_note(page_state(drv) + "\nthe app's log ends:\n" + (tmp_path / "app.log").read_text()[-4000:])
            raise
        finally:
            drv.quit()


def page_state(drv) -> str:
    """The first page's lanes and message, as far as they can be read."""
    try:
        from selenium.webdriver.common.by import By
        lanes = {k: lane_status(drv, k) for k in ("vanilla", "dart")}
        return f"the page: lanes {lanes}, message {drv.find_element(By.CSS_SELECTOR, '#message').text!r}"
    except Exception as exc:  # noqa: BLE001 - a page that cannot be read says so
        return f"the page could not be read: {type(exc).__name__}: {exc}"


def app_health(url: str) -> dict:
    from gradio_client import Client
    client = Client(url, verbose=False, download_files=False)
    try:
        return client.predict(api_name="/health")
    finally:
        client.close()
