"""The device check script runs on a CPU too (its quick mode), and fails when decoding is not lossless."""

from scripts import gpu_check


def test_the_device_check_passes_on_the_cpu(capsys):
    assert gpu_check.main(["--device", "cpu", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "ALL CHECKS PASSED" in out
    assert out.count("PASS ") == 10  # 2 targets x 2 head formats x (lossless, timings), training, its head
    assert "training on 1 process(es)" in out and "anchor tokens in" in out


def test_the_device_check_fails_when_outputs_differ(capsys, monkeypatch):
    real = gpu_check.plain_greedy_reference
    monkeypatch.setattr(gpu_check, "plain_greedy_reference", lambda *a, **k: real(*a, **k)[:-1] + [0])
    assert gpu_check.main(["--device", "cpu", "--quick", "--skip-training"]) == 1
    assert "FAIL  fp32 llama own head lossless: 0/3" in capsys.readouterr().out


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
