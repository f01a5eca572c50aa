"""What the app adds to a run: a run through its handlers (no browser) from Run to the final view, against the time
of the lanes' own steps, at the app's update pace and with an update after every step.

    python -m studies.app_overhead                          # the default model, 512 tokens a lane, two rounds
    python -m studies.app_overhead --max-new-tokens 128 --rounds 1 --draft random

Each run prints its wall time, the lanes' own time (the sum of their steps, which the lane cards' tokens/s read) and
the updates sent; the paces alternate, so a machine that slows down slows both.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from app.callbacks import Callbacks
from app.engine import Engine
from app.pacing import Pace
from app.request import RunRequest
from app.session import Session

# "every step": the lane cards and the newest tree sent after every step, the charts every second
PACES = {"the app's pace": Pace(), "every step": Pace(frame_s=0, tree_s=0, chart_s=1.0, busy_share=1)}
PROMPT = "Write a very long story about a dragon, at least two thousand words."


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--draft", default="default")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--node-budget", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--paces", default=",".join(PACES), help=f"of {', '.join(PACES)} (comma-separated)")
    args = ap.parse_args(argv)
    paces = {name: PACES[name] for name in args.paces.split(",")}
    engine = Engine.load(args.model, args.draft)
    request = RunRequest.named(PROMPT, max_new_tokens=args.max_new_tokens, node_budget=args.node_budget)
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(1, args.rounds + 1):
            for name, pace in paces.items():
                session, started = Session(), time.perf_counter()
                updates = sum(1 for _ in Callbacks(engine, folder, pace=pace).run(session, request))
                wall = time.perf_counter() - started
                own = sum(lane.seconds for lane in session.lanes.values())
                tokens = "/".join(str(lane.tokens) for lane in session.lanes.values())
                print(f"round {round_}, {name:>14}: {wall:6.1f} s from Run to the final view, the lanes' own "
                      f"{own:5.1f} s, {updates} updates, {tokens} tokens", flush=True)


if __name__ == "__main__":
    main()
