"""The command line of scripts/device_payload: split and join a file through it, as a user runs it."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _payload(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scripts.device_payload", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_split_and_join_on_the_command_line_end_cleanly(tmp_path):
    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes(range(256)) * 20)                 # 5,120 bytes: three parts of 2,000
    split = _payload("split", str(blob), str(tmp_path / "parts"), "--part-mib", str(2_000 / 2**20))
    assert split.returncode == 0, split.stderr
    assert split.stderr == ""
    assert split.stdout.strip() == f"{blob}: 3 parts in {tmp_path / 'parts'}"
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == ["part00", "part01", "part02", "parts.json"]

    joined = _payload("join", str(tmp_path / "parts"), str(tmp_path / "back.bin"))
    assert joined.returncode == 0, joined.stderr
    assert (tmp_path / "back.bin").read_bytes() == blob.read_bytes()


def test_a_missing_source_is_a_one_line_error_not_a_traceback(tmp_path):
    result = _payload("split", str(tmp_path / "absent"), str(tmp_path / "parts"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: ") and "absent" in result.stderr
