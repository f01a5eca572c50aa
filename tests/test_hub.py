"""Hub names are an opt-in: without it only the local hub cache is read, and a name not there is refused with what
to do; presets expand to the authors' target, head and table."""

import pytest
from huggingface_hub import constants

from dart_core.setup.hub import (HUB_ENV, PRESETS, HubError, allow_hub, expand_preset, fetch, hub_allowed,
                                 is_hub_id)
from dart_core.ngram import NGramModel
from dart_core.setup.loading import load_draft, load_ngram
from dart_core.setup.models import ModelLoadError, resolve_model_path
from dart_core.tools.args import resolve_model_names
from dart_core.tools.cli import build_parser
from tests.authors_format import write_authors_head
from dart_core.setup.tiny_models import tiny_target

REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty hub cache of our own, the opt-in off, and a hub endpoint that answers nothing."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv(HUB_ENV, "0")
    return cache


def cached_repo(cache, repo: str, kind: str = "models"):
    """The folder a downloaded snapshot of `repo` lives in, laid out as huggingface_hub lays out its cache."""
    root = cache / f"{kind}--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(REVISION)
    snapshot = root / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    return snapshot


def test_hub_ids_and_presets():
    assert is_hub_id("Qwen/Qwen3-1.7B") and is_hub_id("fvliang/dart-qwen3-ngram:small.trie")
    assert not is_hub_id("default") and not is_hub_id("runs/../x/y/z") and not is_hub_id("tests")
    preset = PRESETS["qwen3-1.7b"]
    assert (preset.model, preset.draft, preset.ngram) == ("Qwen/Qwen3-1.7B", "fvliang/qwen1.7b-dart",
                                                          "fvliang/dart-qwen3-ngram:small.trie")
    assert expand_preset("qwen3-8b", "default", "none") == ("Qwen/Qwen3-8B", "fvliang/qwen8b-dart", "none")
    assert expand_preset("default", "default", "default") == ("default", "default", "default")


def test_a_preset_on_the_command_line_fills_in_head_and_table(hub_cache):
    args = build_parser().parse_args(["generate", "--model", "qwen3-4b", "--prompt", "hi", "--draft", "mine"])
    resolve_model_names(args)
    assert (args.model, args.draft, args.ngram) == ("Qwen/Qwen3-4B", "mine", "fvliang/dart-qwen3-ngram:small.trie")
    assert not hub_allowed()
    resolve_model_names(build_parser().parse_args(["generate", "--prompt", "hi", "--hub"]))
    assert hub_allowed()


def test_nothing_is_fetched_without_the_opt_in(hub_cache):
    with pytest.raises(HubError, match="not on this machine.*add --hub.*hf download Qwen/Qwen3-1.7B"):
        resolve_model_path("Qwen/Qwen3-1.7B")
    with pytest.raises(HubError, match="hf download fvliang/dart-qwen3-ngram small.trie"):
        fetch("fvliang/dart-qwen3-ngram:small.trie", "n-gram table")
    with pytest.raises(ModelLoadError, match="neither 'default', a local folder, nor a hub id"):
        resolve_model_path("no such thing")


def test_with_the_opt_in_an_unreachable_hub_is_a_clear_error(hub_cache):
    allow_hub()
    with pytest.raises(HubError, match="could not be"):
        fetch("fvliang/qwen1.7b-dart", "draft head")


def test_names_in_the_local_hub_cache_load_offline(hub_cache):
    target = tiny_target("qwen3", vocab=96, hidden=64, layers=6)
    head_dir = cached_repo(hub_cache, "fvliang/qwen-tiny-dart")
    write_authors_head(head_dir, target)
    head = load_draft("fvliang/qwen-tiny-dart", target)
    assert head.config.double_norm and head.config.n_mask == 3
    model_dir = cached_repo(hub_cache, "Qwen/Qwen3-Tiny")
    target.model.save_pretrained(model_dir)
    assert resolve_model_path("Qwen/Qwen3-Tiny") == str(model_dir)


def test_an_ngram_file_in_the_local_hub_cache_loads_offline(hub_cache):
    snapshot = cached_repo(hub_cache, "fvliang/tiny-ngram")
    NGramModel.build([[3, 4, 5, 3, 4, 6]], vocab_size=16).save(snapshot / "table.npz")
    table = load_ngram("fvliang/tiny-ngram:table.npz")
    assert table.vocab_size == 16 and table.counts[0].sum() == 6
    with pytest.raises(HubError, match="hf download fvliang/tiny-ngram other.npz"):
        load_ngram("fvliang/tiny-ngram:other.npz")
