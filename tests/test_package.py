"""DART Lab as a package: what `pip install .` builds, and an engine that runs without the app's libraries."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from dart_core.setup.tiny_training import save_tiny_qwen3, write_chats

ROOT = Path(__file__).resolve().parents[1]
APP_STACK = ("plotly", "pandas", "networkx", "gradio", "scipy")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_package_list_names_every_package_in_the_tree():
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for top in ("dart_core", "app")
               for p in (ROOT / top).rglob("__init__.py")}
    assert listed - {"dart_core.assets"} == on_disk
    assert _pyproject()["tool"]["setuptools"]["package-dir"] == {"dart_core.assets": "assets"}


def test_the_wheel_carries_the_engine_the_app_the_shipped_assets_and_both_commands(tmp_path):
    # built from a copy of the sources: setuptools' build/ folder in a checkout keeps modules since moved away
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "runs", "*.egg-info",
                                                                "__pycache__", ".pytest_cache"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path), str(source)], capture_output=True, text=True, cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("dart_lab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"dart_core/tools/cli.py", "app/ui.py", "app/help.md", "app/style.css", "dart_core/assets/smollm2-ngram3.npz",
            "dart_core/assets/smollm2-dart-head/model.safetensors"} <= names
    from dart_core.machine.few_rows import SOURCES   # every C source the kernels are built from
    assert {f"dart_core/machine/{source.name}" for source in SOURCES} <= names
    in_tree = {str(p.relative_to(ROOT)) for top in ("dart_core", "app") for p in (ROOT / top).rglob("*.py")}
    assert {n for n in names if n.endswith(".py")} == in_tree    # every module, and none that is gone
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    scripts = zipfile.ZipFile(wheel).read(entry).decode()
    assert "dart-lab = dart_core.tools.cli:main" in scripts and "dart-lab-app = app.cli:main" in scripts


# The child process: the app's libraries cannot be imported (None in sys.modules is how Python spells "not
# installed" to `import` and to importlib.util.find_spec alike), then each command runs as `dart-lab` would run it.
CHILD = """
import json, sys
for name in {stack!r}:
    sys.modules[name] = None
from dart_core.tools.cli import main
codes = [main(argv) for argv in json.loads(sys.argv[1])]
leaked = sorted(n for n in sys.modules if n.split('.')[0] in {stack!r} and sys.modules[n] is not None)
print(json.dumps({{"codes": codes, "leaked": leaked}}))
"""


def test_generate_bench_ngram_and_train_run_without_the_app_stack(tmp_path):
    model = tmp_path / "model"
    save_tiny_qwen3(model)
    chats = write_chats(tmp_path / "chats.jsonl", 30)
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": f"alpha beta gamma {i} delta"}) + "\n" for i in range(20)))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "hello world"}) + "\n")
    tiny = ["--model", str(model), "--draft", "random", "--ngram", "none"]
    commands = [
        ["generate", *tiny, "--method", "dart", "--prompt", "hello world", "--max-new-tokens", "6", "--json"],
        ["bench", *tiny, "--prompts", str(prompts), "--methods", "hf_generate,vanilla,dart", "--dtype", "fp32",
         "--temperature", "0", "--max-new-tokens", "6", "--warmup", "0", "--no-progress",
         "--out", str(tmp_path / "bench" / "report.json")],
        ["ngram", "build", "--model", str(model), "--sources", f"generated:{texts}", "--no-progress",
         "--out", str(tmp_path / "table.npz")],
        ["train", "--model", str(model), "--chats", str(chats), "--sharegpt", "0", "--vocab-ngram", "none",
         "--heldout", "3", "--n-mask", "3", "--draft-vocab", "64", "--anchors", "16", "--steps", "2",
         "--eval-every", "100", "--dtype", "fp32", "--out", str(tmp_path / "run")],
        ["report", str(tmp_path / "missing.json"), "--out", str(tmp_path / "r.html")],
    ]
    env = {**os.environ, "DART_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CHILD.format(stack=APP_STACK), json.dumps(commands)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"codes": [0, 0, 0, 0, 2], "leaked": []}
    # the one command that draws says what to install, in one line
    assert "error: the report needs the app's libraries" in done.stderr and "dart-lab[app]" in done.stderr
    assert (tmp_path / "bench" / "report.json").is_file() and (tmp_path / "table.npz").is_file()
