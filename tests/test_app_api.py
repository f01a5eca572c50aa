"""The app's API as a program meets it: the app serves the tiny target on a free port, and gradio_client calls `/run`
by its parameters' names; `view_api()` lists those names, and the page's own events stay out of it."""

from __future__ import annotations

import pytest

from app.api import API_FIELDS
from app.session import SessionStore
from app.ui import build_app, launch_kwargs
from scripts.app_server import free_port
from tests.app_fixtures import tiny_engine

KNOB_NAMES = ["node_budget", "beam_width", "topk", "ngram_weight", "level_exponent", "logit_decay"]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DART_CACHE_DIR", str(cache))        # the tiny model's verify cost curve: measured here
        mp.setenv("GRADIO_ANALYTICS_ENABLED", "False")
        sessions = SessionStore()
        demo = build_app(tiny_engine(), trace_dir=tmp_path_factory.mktemp("traces"), sessions=sessions)
        demo.queue(default_concurrency_limit=4)
        port = free_port()
        demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                    show_error=False, **launch_kwargs(sessions))
        try:
            yield f"http://127.0.0.1:{port}/"
        finally:
            demo.close()


@pytest.fixture(scope="module")
def client(url):
    from gradio_client import Client
    c = Client(url, verbose=False, download_files=False)
    yield c
    c.close()


def test_view_api_names_every_parameter_of_run(client):
    api = client.view_api(print_info=False, return_format="dict")
    assert set(api["named_endpoints"]) == {"/run", "/health"}        # the page's own events are not the API
    params = {p["parameter_name"]: p for p in api["named_endpoints"]["/run"]["parameters"]}
    assert list(params)[:2] == ["prompt", "max_new_tokens"] and list(params) == list(API_FIELDS)
    assert set(KNOB_NAMES) <= set(params) and "show_pruned" not in params
    assert not params["prompt"]["parameter_has_default"]
    assert params["max_new_tokens"]["parameter_default"] == 64 and params["auto_budget"]["parameter_default"] is True
    assert params["max_new_tokens"]["python_type"]["type"] == "int"
    assert params["ngram_weight"]["python_type"]["type"] == "float"
    assert params["use_pld"]["python_type"]["type"] == "bool"


def test_run_by_name_gives_plain_and_dart_the_same_text(client):
    result = client.predict(prompt="hello there", max_new_tokens=12, node_budget=6, topk=6, beam_width=4,
                            auto_budget=False, api_name="/run")
    plain, dart = result["lanes"]["vanilla"], result["lanes"]["dart"]
    assert set(result["lanes"]) == {"vanilla", "dart"}
    assert plain["text"] and plain["text"] == dart["text"] and plain["token_ids"] == dart["token_ids"]
    assert result["identical"] is True
    assert plain["tokens"] == dart["tokens"] == len(dart["token_ids"]) == 12
    assert plain["status"] == dart["status"] == "done" and dart["method"] == "dart"
    assert plain["tokens_per_s"] > 0 and dart["tokens_per_s"] > 0 and result["speedup"] > 0
    assert dart["tau"] >= 1 and "tau" not in plain
    assert dart["steps"] < plain["steps"] or dart["tau"] == 1   # each verify step emits tau tokens


def test_run_with_the_automatic_budget_and_prompt_lookup(client):
    result = client.predict(prompt="ab ab ab ab ab", max_new_tokens=8, use_pld=True, lookup_branch=True,
                            api_name="/run")
    lanes = result["lanes"]
    assert set(lanes) == {"vanilla", "dart", "pld"} and lanes["dart"]["method"] == "dart_pld"
    assert lanes["vanilla"]["token_ids"] == lanes["dart"]["token_ids"] == lanes["pld"]["token_ids"]


def test_bad_input_gets_a_message_not_a_traceback(client):
    from gradio_client.exceptions import AppError
    for kwargs, message in (({"prompt": "  "}, "The prompt is empty"),
                            ({"prompt": "hi", "node_budget": -3}, "Node budget must be between 0 and 256"),
                            ({"prompt": "hi", "max_new_tokens": 0}, "Max new tokens must be between 1 and 512")):
        with pytest.raises(AppError, match=message) as caught:
            client.predict(**kwargs, api_name="/run")
        assert "Traceback" not in str(caught.value)


def test_the_api_keeps_nothing_per_caller(client):
    client.predict(prompt="one more", max_new_tokens=4, auto_budget=False, api_name="/run")
    health = client.predict(api_name="/health")
    assert health["sessions"] == 0 and health["trace_dir_folders"] == 0
