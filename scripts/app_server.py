"""Starting `python app.py` on a free port for a test, a screenshot or a soak, and stopping it afterwards."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_app(*args: str, timeout: float = 180.0, log_path: Path | None = None, env: dict | None = None):
    """Start `python app.py ARGS --port FREE` (with `env` added to this process's environment) and yield (its URL,
    its pid) once it answers; stop it afterwards."""
    port = free_port()
    log_path = log_path or Path(tempfile.mkstemp(prefix="dart-lab-app-", suffix=".log")[1])
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1", **(env or {}))
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--host", "127.0.0.1", "--port", str(port),
                                 *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the app exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the app did not answer within {timeout:.0f} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
