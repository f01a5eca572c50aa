"""The app's API for programs: `/run` takes a run's settings by name (gradio_client's `view_api()` lists them) and
returns JSON: each lane's text, token ids, tokens per second and τ. It keeps nothing per caller: the lanes are stepped
to their end (one step at a time under the engine's lock, as the page's runs are) and dropped.

    from gradio_client import Client
    result = Client("http://127.0.0.1:7860/").predict(prompt="What is 2 + 2?", max_new_tokens=32, api_name="/run")
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import gradio as gr

from dart_core.errors import DartError
from dart_core.methods import DART, VANILLA

from .callbacks import Callbacks
from .lanes import Lane, round_robin
from .options import KNOBS
from .request import RUN_FIELDS, RunRequest

# The page's run settings less the page's own view (show_pruned), the prompt and the length first.
API_FIELDS = ("prompt", "max_new_tokens",
              *(name for name in RUN_FIELDS if name not in ("prompt", "max_new_tokens", "show_pruned")))
# Where the API's defaults differ from a bare RunRequest's: the node budget is chosen as the run goes, as on the page
# and on the command line.
API_DEFAULTS = {"auto_budget": True}


def api_parameters() -> list[inspect.Parameter]:
    """The `/run` API's named parameters, typed, with their defaults (from RunRequest and the knobs)."""
    request = RunRequest()
    params = []
    for name in API_FIELDS:
        default = API_DEFAULTS.get(name, request.knobs.get(name, getattr(request, name, None)))
        knob = KNOBS.get(name)
        kind = (int if knob.integer else float) if knob else type(default)
        required = name == "prompt"   # the one setting without a default
        params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=kind,
                                        default=inspect.Parameter.empty if required else default))
    return params


def lane_result(lane: Lane, tokenizer) -> dict:
    """One lane's outcome, as plain JSON values."""
    trace, metrics = lane.trace, lane.metrics
    out = {"method": trace.method, "status": lane.status,
           "text": tokenizer.decode(trace.output_ids, skip_special_tokens=True),
           "token_ids": [int(t) for t in trace.output_ids], "tokens": lane.tokens, "steps": len(trace.steps),
           "seconds": round(lane.seconds, 4), "tokens_per_s": round(lane.tokens_per_s, 2),
           "stop_reason": trace.steps[-1].stop_reason if trace.steps else None}
    if lane.key != VANILLA:
        out["tau"] = round(metrics.tau, 3) if metrics.verify_steps else None
    if lane.error:
        out["error"] = lane.error
    return out


def run_result(lanes: list[Lane], tokenizer) -> dict:
    """Every lane's outcome, whether DART's tokens are plain decoding's, and DART's speedup over it."""
    out = {key: lane_result(lane, tokenizer) for key, lane in ((lane.key, lane) for lane in lanes)}
    plain, dart = out[VANILLA], out[DART]
    speedup = dart["tokens_per_s"] / plain["tokens_per_s"] if plain["tokens_per_s"] and dart["tokens_per_s"] else None
    return {"lanes": out, "identical": plain["token_ids"] == dart["token_ids"],
            "speedup": round(speedup, 3) if speedup else None}


def run_api(cb: Callbacks) -> Callable[..., dict]:
    """The `/run` endpoint's function. Its signature is made from the run's settings (api_parameters), so that a
    knob added to SearchConfig is an API parameter too; Gradio reads the names, types and defaults from it."""
    def run(*values) -> dict:
        request = RunRequest.named(**dict(zip(API_FIELDS, values)))
        try:
            lanes = cb.new_lanes(request)
        except DartError as exc:
            raise gr.Error(str(exc), print_exception=False) from None
        for _ in round_robin(lanes, lock=cb.engine.lock):
            pass
        return run_result(lanes, cb.engine.tokenizer)

    params = api_parameters()
    run.__signature__ = inspect.Signature(params, return_annotation=dict)
    run.__annotations__ = {**{p.name: p.annotation for p in params}, "return": dict}
    run.__doc__ = ("Generate with plain decoding and DART (and prompt lookup with use_pld) from one prompt; returns "
                   "each lane's text, token ids, tokens/s and tau, whether DART's tokens equal plain decoding's, and "
                   "DART's speedup.")
    return run
