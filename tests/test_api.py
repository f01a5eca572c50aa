"""The Python API (dart_core.api): the README's example runs as written, and the API decodes losslessly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import dart_core
from dart_core.api import Lab
from dart_core.errors import ConfigError
from dart_core.setup.loading import Loaded
from dart_core.setup.tiny_models import plain_greedy_reference, tiny_target
from dart_core.trace import Trace

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_section(title: str) -> str:
    text = README.read_text()
    section = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_is_a_front_page():
    assert len(README.read_text().splitlines()) <= 150


def test_the_readme_python_example_runs_as_written(default_model_once, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(readme_section("Python"), "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) >= 3 and Trace.load(tmp_path / "run.json.gz").method == "dart"


@pytest.fixture(scope="module")
def tiny_lab():
    from dart_core.setup.tiny_models import random_head
    target = tiny_target("qwen3", seed=2)
    return Lab(Loaded(target, head=random_head(target), model="tiny"))


def test_every_method_through_the_api_is_the_target_own_greedy_output(tiny_lab):
    prompt = [5, 9, 11, 5, 9, 30, 31]
    expected = plain_greedy_reference(tiny_lab.target, prompt, 12)
    for method in ("vanilla", "pld", "dart", "dart_pld"):
        result = tiny_lab.generate(prompt, method=method, max_new_tokens=12, node_budget=8)
        assert result.token_ids == expected and result.trace.output_ids == expected, method
        assert result.metrics.new_tokens == 12 and result.trace.steps[0].kind == "prefill"
    streamed = [t for step in tiny_lab.stream(prompt, method="dart", max_new_tokens=12) for t in step.new_tokens]
    assert streamed == expected                     # the automatic budget too


def test_bad_calls_say_what_is_wrong(tiny_lab):
    with pytest.raises(ConfigError, match="unknown method 'eagle'"):
        tiny_lab.generate([5, 6], method="eagle")
    with pytest.raises(ConfigError, match="unknown knob"):
        tiny_lab.generate([5, 6], beam_size=3)
    with pytest.raises(ConfigError, match="empty"):
        tiny_lab.generate([])
    plain_only = Lab(Loaded(tiny_lab.target, model="tiny"))
    with pytest.raises(ConfigError, match="needs a draft head"):
        plain_only.generate([5, 6], method="dart")
    assert dart_core.load is dart_core.api.load
