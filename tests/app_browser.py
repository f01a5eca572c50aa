"""Driving the app in Debian's chromium (selenium, no browser download): used by tests/test_app_e2e.py, and run as
a script to refresh the README screenshot:

    python -m tests.app_browser --out assets/screenshot.png
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tempfile
import time
from pathlib import Path

from scripts.app_server import serve_app

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_NAMES = ("chromium", "chromium-browser")
LAUNCH_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--hide-scrollbars")


def find_chromium() -> tuple[str | None, str | None, str]:
    """(browser, driver, why-not): the paths of chromium and chromedriver, or a reason they cannot be used."""
    browser = next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)
    driver = shutil.which("chromedriver")
    if importlib.util.find_spec("selenium") is None:
        return browser, driver, "selenium is not installed (pip install selenium==4.51.0)"
    if not browser or not driver:
        return browser, driver, ("no chromium / chromedriver on PATH "
                                 "(apt-get install -y chromium chromium-driver; .ci/run installs them)")
    return browser, driver, ""


def make_driver(browser: str, driver: str, width: int = 1500, height: int = 1900):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for flag in LAUNCH_FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={tempfile.mkdtemp(prefix='dart-lab-chromium-')}")
    opts.add_argument(f"--window-size={width},{height}")
    return webdriver.Chrome(service=Service(executable_path=driver), options=opts)


# ------------------------------------------------------------------ page helpers
def wait_for(drv, fn, timeout: float, what: str, poll: float = 0.25):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn(drv)
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - stale elements while Gradio re-renders
            last = exc
        time.sleep(poll)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def element(drv, css: str, what: str | None = None, timeout: float = 30.0):
    """The first element matching `css` once it is displayed (Gradio renders an accordion's contents when it opens,
    and re-renders components as events update them)."""
    from selenium.webdriver.common.by import By
    return wait_for(drv, lambda d: next((e for e in d.find_elements(By.CSS_SELECTOR, css) if e.is_displayed()), None),
                    timeout, what or css)


def click(drv, css: str, what: str | None = None, timeout: float = 30.0):
    """Wait until an element matching `css` is displayed and enabled, and click it (again, if a re-render took it
    away or covered it at the moment of the click)."""
    from selenium.webdriver.common.by import By

    def try_click(d):
        found = next((e for e in d.find_elements(By.CSS_SELECTOR, css) if e.is_displayed() and e.is_enabled()), None)
        if found is not None:
            found.click()
        return found
    return wait_for(drv, try_click, timeout, what or f"{css} to be clickable")


def lane_status(drv, key: str) -> str:
    from selenium.webdriver.common.by import By
    return drv.find_element(By.CSS_SELECTOR, f"#lane-{key} .lane").get_attribute("data-status")


def tree_title(drv) -> str:
    from selenium.webdriver.common.by import By
    return drv.find_element(By.CSS_SELECTOR, "#tree-plot .gtitle").text


def tree_points(drv) -> int:
    """Markers drawn in the tree plot (one per node)."""
    from selenium.webdriver.common.by import By
    return len(drv.find_elements(By.CSS_SELECTOR, "#tree-plot .scatterlayer .points path.point"))


def dismiss_tour(drv) -> None:
    """Close the first-visit tour (shown on load in a fresh browser profile) with its "Got it" button."""
    from selenium.webdriver.common.by import By
    click(drv, "#tour-ok", "the tour's button", 60)
    wait_for(drv, lambda d: not d.find_elements(By.CSS_SELECTOR, "#tour-ok") or
             not d.find_element(By.CSS_SELECTOR, "#tour-ok").is_displayed(), 30, "the tour to close")


def run_prompt(drv, prompt: str, timeout: float = 150.0, wait: bool = True) -> None:
    """Type a prompt, press Run, and wait until the run starts and (`wait`) until both lanes are done."""
    from selenium.webdriver.common.by import By
    box = element(drv, "#prompt textarea", "the prompt box", 60)
    box.clear()
    box.send_keys(prompt)
    click(drv, "#run-btn", "the Run button")
    wait_for(drv, lambda d: lane_status(d, "dart") not in ("idle",), 30, "the run to start")
    if not wait:
        return
    wait_for(drv, lambda d: all(lane_status(d, k).startswith("done") for k in ("vanilla", "dart")), timeout,
             "both lanes to finish")
    wait_for(drv, lambda d: d.find_element(By.CSS_SELECTOR, "#run-btn").is_enabled(), 60, "the run to end")


def open_accordion(drv, label: str, close: bool = False) -> None:
    """Open (or close) the accordion whose label contains `label`."""
    from selenium.webdriver.common.by import By
    button = wait_for(drv, lambda d: next((b for b in d.find_elements(By.CSS_SELECTOR, "button.label-wrap")
                                           if label in b.text), None), 60, f"the {label!r} accordion")
    if ("open" in (button.get_attribute("class") or "").split()) == close:
        button.click()


def set_slider(drv, elem_id: str, value: int) -> None:
    """Type a value into a Gradio slider's number box (fires its input event)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    box = wait_for(drv, lambda d: next((e for e in d.find_elements(By.CSS_SELECTOR, f"#{elem_id} input[type=number]")
                                        if e.is_displayed()), None), 30, f"the {elem_id} slider")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(str(value), Keys.ENTER)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Take the README screenshot of the app")
    p.add_argument("--out", default=str(ROOT / "assets" / "screenshot.png"))
    p.add_argument("--prompt", default="List every city named in this text: I flew from Paris to Tokyo, "
                                       "then took a train from Tokyo to Osaka and a bus back to Paris.")
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--step", type=int, default=None, help="show this step (default: the last one)")
    p.add_argument("--pruned", action="store_true", help="show the pruned candidates in the tree")
    p.add_argument("--size", default="1600x2050", help="window WIDTHxHEIGHT")
    p.add_argument("--app-arg", action="append", default=[], help="extra flag for app.py (repeatable)")
    args = p.parse_args(argv)
    browser, driver, why = find_chromium()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    width, height = (int(v) for v in args.size.split("x"))
    with serve_app(*args.app_arg) as (url, _):
        drv = make_driver(browser, driver, width, height)
        try:
            drv.get(url)
            dismiss_tour(drv)
            open_accordion(drv, "Sampling")
            set_slider(drv, "max-new-tokens", args.max_new_tokens)
            open_accordion(drv, "Sampling", close=True)
            click(drv, "#use-pld input", "the prompt lookup checkbox")
            run_prompt(drv, args.prompt, timeout=900)
            if args.step is not None:
                set_slider(drv, "step-slider", args.step)
            if args.pruned:
                click(drv, "#show-pruned input", "the pruned candidates checkbox")
            drv.execute_script("document.activeElement && document.activeElement.blur()")
            time.sleep(2.0)
            drv.save_screenshot(args.out)
        finally:
            drv.quit()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
