"""The learning curve's points: only a schedule's end (an annealed run's last evaluation, or a continued run's
start, which is its starting head's score) enters the fit; a run stopped early is inside its schedule."""

from __future__ import annotations

import json

import pytest
import torch

from scripts.learning_curve import run_points


def write_run(folder, last_step: int, schedule: int, started_from: dict | None = None):
    history = [{"step": s, "row_top1": [0.40 + s / 1e5], "chain_tau": 1.6, "tokens_seen": 300 * s}
               for s in range(0, last_step + 1, 200)]
    folder.mkdir()
    torch.save({"step": last_step, "tokens_seen": 300 * last_step, "history": history,
                "sessions": [{"command": "train ...", "minutes": 10.0}]}, folder / "ckpt.pt")
    (folder / "best").mkdir()
    metrics = {"train_config": {"max_steps": schedule}, "started_from": started_from}
    (folder / "best" / "metrics.json").write_text(json.dumps(metrics))


@pytest.mark.parametrize("last_step,annealed", [(1000, True), (400, False)])
def test_only_a_run_that_reached_its_schedules_end_ends_there(tmp_path, last_step, annealed):
    write_run(tmp_path / "run", last_step, 1000, started_from={"tokens_seen": 5000})
    points, provenance = run_points(tmp_path / "run")
    assert [p["step"] for p in points] == list(range(0, last_step + 1, 200))
    assert points[0]["endpoint"] and points[0]["tokens"] == 5000          # the starting head's own score
    assert points[-1]["endpoint"] == annealed
    assert not any(p["endpoint"] for p in points[1:-1])
    assert provenance["tokens_seen"] == 300 * last_step and provenance["anchor_tokens_per_s"] == round(
        300 * last_step / 600)
