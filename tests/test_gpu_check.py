"""The device check script runs on a CPU too (its quick mode), and fails when decoding is not lossless."""

from scripts import gpu_check


def test_the_device_check_passes_on_the_cpu(capsys):
    assert gpu_check.main(["--device", "cpu", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "ALL CHECKS PASSED" in out
    assert out.count("PASS ") == 8   # 2 targets x 2 head formats x (lossless, timings)


def test_the_device_check_fails_when_outputs_differ(capsys, monkeypatch):
    real = gpu_check.plain_greedy_reference
    monkeypatch.setattr(gpu_check, "plain_greedy_reference", lambda *a, **k: real(*a, **k)[:-1] + [0])
    assert gpu_check.main(["--device", "cpu", "--quick"]) == 1
    assert "FAIL  fp32 llama own head lossless: 0/3" in capsys.readouterr().out


def test_cuda_asked_for_without_cuda_is_one_clear_line(capsys, monkeypatch):
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--device", "cuda"]) == 2
    assert "CUDA is not available here" in capsys.readouterr().err
