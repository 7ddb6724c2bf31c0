"""The progress line: rate and ETA leave the first iteration's warm-up out."""

from __future__ import annotations

import io

from psframework import metrics
from psframework.metrics import Progress


def test_rate_and_eta_leave_the_warm_up_out(monkeypatch):
    clock = iter([0.0, 10.0] + [10.0 + 0.01 * i for i in range(1, 100)])
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: next(clock))
    out = io.StringIO()
    progress = Progress(1000, "lines", stream=out)
    progress.update(1, 0, 2.3)  # the first iteration took 10 s: compilation, first touches, connections
    for i in range(2, 101):
        progress.update(i, 0, 2.0, extra="x" if i == 100 else "")
    lines = out.getvalue().splitlines()
    assert "warming up" in lines[0]
    assert "100.0 it/s eta 9s" in lines[-1]  # 99 iterations in 0.99 s; 900 to go


def test_a_launcher_on_a_terminal_gets_the_bar(monkeypatch):
    monkeypatch.delenv("PSF_TERMINAL", raising=False)
    assert Progress(10, "auto", stream=io.StringIO()).mode == "lines"
    monkeypatch.setenv("PSF_TERMINAL", "1")  # hpc/psf-mpirun: its standard error is a terminal
    assert Progress(10, "auto", stream=io.StringIO()).mode == "bar"
    assert Progress(10, "lines", stream=io.StringIO()).mode == "lines"
