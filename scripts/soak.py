"""Soak the app: many short-lived visitors, one after another, each a new session that runs one prompt through the
app's API (gradio_client) and leaves. Reports, every few visitors, the server's RSS, what it holds (sessions, their
folders, Gradio's pages) and the bytes of its temporary files, so that growth without bound shows.

    python -m scripts.soak --sessions 300 --max-new-tokens 16 --out runs/soak.json
    python -m scripts.soak --url http://127.0.0.1:7860/ --sessions 50      # an app already running
    python -m scripts.soak --sessions 40 -- --model path/to/model --draft random --ngram none   # flags for app.py

Started by the script, the app gets a temporary folder of its own (TMPDIR, GRADIO_TEMP_DIR), so every file it writes
is counted. Exit status 1 if a run failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from app.health import bytes_under
from app.request import RunRequest
from scripts.app_server import serve_app

RUN_DEFAULTS = {"use_pld": False, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0, "node_budget": 12,
                "beam_width": 8, "topk": 8, "ngram_weight": 0.5, "level_exponent": 0.7, "logit_decay": 0.9,
                "show_pruned": False, "lookup_branch": False, "auto_budget": False}   # RunRequest's fields
PROMPTS = ("Write a Python function that adds two numbers.", "What is the capital of France?",
           "List three colours.", "Explain recursion in one sentence.")


def server_rss(pid: int | None) -> int:
    """The server process's resident set size, read from /proc (0 where it cannot be)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, TypeError):
        pass
    return 0


def one_visitor(client, prompt: str, max_new_tokens: int) -> str:
    """A new session (the client's session is reset) runs one prompt to its end and leaves; returns "" or what went
    wrong."""
    client.reset_session()
    request = RunRequest.named(prompt, **{**RUN_DEFAULTS, "max_new_tokens": max_new_tokens})
    try:   # the page's own Run (a visitor's session and all it shows), not the JSON API
        out = client.predict(*request.values(), api_name="/page_run")
    except Exception as exc:  # noqa: BLE001 - a failed visitor is counted, not fatal
        return f"{type(exc).__name__}: {exc}"
    lanes = [v for v in out if isinstance(v, str) and 'class="lane' in v]
    done = [v for v in lanes if 'data-status="done' in v]
    return "" if lanes and len(done) == len(lanes) else f"lanes not done: {[v[:120] for v in lanes]}"


def soak(url: str, sessions: int, max_new_tokens: int = 16, every: int = 10, pid: int | None = None,
         temp_dir: str | None = None, log=print) -> dict:
    """Drive `sessions` visitors; a sample of the server's state after every `every` of them (and at the start)."""
    from gradio_client import Client
    client = Client(url, verbose=False, download_files=False)   # a visitor's downloads are not the app's memory
    samples, failures = [], []
    t0 = time.monotonic()

    def sample(done: int) -> None:
        h = client.predict(api_name="/health")
        s = {"visitors": done, "s": round(time.monotonic() - t0, 1),
             "rss_mb": round((server_rss(pid) or h["rss_bytes"]) / 2**20, 1), "sessions": h["sessions"],
             "folders": h["trace_dir_folders"], "gradio_pages": h["gradio_pages"],
             "temp_mb": round((bytes_under(temp_dir) if temp_dir else
                               h["trace_dir_bytes"] + h["gradio_cache_bytes"]) / 2**20, 2)}
        samples.append(s)
        log(" ".join(f"{k}={v}" for k, v in s.items()))

    try:
        sample(0)
        for i in range(sessions):
            why = one_visitor(client, PROMPTS[i % len(PROMPTS)], max_new_tokens)
            if why:
                failures.append({"visitor": i, "error": why})
                log(f"visitor {i} failed: {why}")
            if (i + 1) % every == 0 or i + 1 == sessions:
                sample(i + 1)
    finally:
        with contextlib.suppress(Exception):
            client.close()
    return {"samples": samples, "failures": failures, "summary": summarize(samples, failures)}


def summarize(samples: list[dict], failures: list) -> dict:
    """RSS growth after the first 20 visitors (the warm-up: caches, first compilations), and the peaks held."""
    after_warmup = next((s for s in samples if s["visitors"] >= 20), samples[0])
    last = samples[-1]
    return {"visitors": last["visitors"], "failed": len(failures), "rss_mb_after_20": after_warmup["rss_mb"],
            "rss_mb_last": last["rss_mb"], "rss_growth_mb": round(last["rss_mb"] - after_warmup["rss_mb"], 1),
            "max_sessions_held": max(s["sessions"] for s in samples),
            "max_temp_mb": max(s["temp_mb"] for s in samples)}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    app_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=300, help="visitors, one after another")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--every", type=int, default=10, help="sample the server after this many visitors")
    p.add_argument("--url", default=None, help="an app already running (else one is started: app.py + the flags "
                                               "after --)")
    p.add_argument("--ttl", type=float, default=None, help="DART_LAB_SESSION_TTL for the started app")
    p.add_argument("--max-held", type=int, default=None, help="DART_LAB_MAX_SESSIONS for the started app")
    p.add_argument("--out", default=None, help="write the samples and the summary here (JSON)")
    args = p.parse_args(argv)
    if args.url:
        result = soak(args.url, args.sessions, args.max_new_tokens, args.every)
    else:
        temp = tempfile.mkdtemp(prefix="dart-lab-soak-")
        env = {"TMPDIR": temp, "GRADIO_TEMP_DIR": str(Path(temp) / "gradio")}
        if args.ttl is not None:
            env["DART_LAB_SESSION_TTL"] = str(args.ttl)
        if args.max_held is not None:
            env["DART_LAB_MAX_SESSIONS"] = str(args.max_held)
        try:
            with serve_app(*app_args, env=env) as (url, pid):
                result = soak(url, args.sessions, args.max_new_tokens, args.every, pid, temp)
        finally:
            shutil.rmtree(temp, ignore_errors=True)
    result["settings"] = {"sessions": args.sessions, "max_new_tokens": args.max_new_tokens, "app_args": app_args,
                          "ttl": args.ttl, "max_held": args.max_held, "url": args.url}
    print(json.dumps(result["summary"]))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
