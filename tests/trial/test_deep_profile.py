"""`autotune profile`: the trace, the memory timeline and findings naming the user's lines."""

from __future__ import annotations

import io
import json

import matplotlib.image
import pytest

from ..conftest import run_cli
from .test_diagnosis import SYNC_MODEL, _line_of


@pytest.mark.slow
def test_profile_command_writes_trace_memory_image_and_findings(tmp_path) -> None:
    out = tmp_path / "prof"
    done = run_cli("profile", "--model", str(SYNC_MODEL), "--device", "cpu", "--steps", "2",
                   "--set", "micro_batch_size=8", "--out", str(out))
    assert done.returncode == 0, done.stderr
    line = _line_of(SYNC_MODEL, ".abs().item()")
    assert f"sync_loss.py:{line}" in done.stdout
    for title in ("samples/sec", "self CPU total", "Top operators by self CPU time",
                  "Top operators by input shape", "findings (what to fix first)"):
        assert title in done.stdout
    traces = list((out / "trace").glob("*.pt.trace.json"))  # TensorBoard's plugin's naming
    assert len(traces) == 1
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert any(e.get("cat") == "cpu_op" for e in events)
    image = (out / "memory.png").read_bytes()
    assert image.startswith(b"\x89PNG\r\n\x1a\n")
    assert matplotlib.image.imread(io.BytesIO(image), format="png").shape[0] > 100
    saved = json.loads((out / "profile.json").read_text())
    assert saved["config"]["micro_batch_size"] == 8
    assert any(f["kind"] == "host_sync" for f in saved["findings"])
    assert f"sync_loss.py:{line}" in (out / "profile.txt").read_text()


def test_profile_rejects_bad_input_with_exit_2(tmp_path) -> None:
    done = run_cli("profile", "--model", str(SYNC_MODEL), "--device", "cpu",
                   "--set", "precision=fp64", "--out", str(tmp_path))
    assert done.returncode == 2
    assert "precision" in done.stderr and "Traceback" not in done.stderr
