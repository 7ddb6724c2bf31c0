"""The shipped digits configs train to the accuracy the docs promise, under mpiexec as users run them."""

from __future__ import annotations

import json
import os

import pytest

from mpiutil import describe, run_psf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["digits_sazd", "digits_stanza", "digits_resnet20_sazd"])
def test_digits_config_reaches_95_percent_in_5_epochs(tmp_path, name):
    config = os.path.join(ROOT, "configs", f"{name}.yaml")
    proc = run_psf(5, ["train", config, f"output.dir={tmp_path}", "output.progress=off"], timeout=280)
    assert proc.returncode == 0, describe(proc)
    summary = json.loads((tmp_path / name / "summary.json").read_text())
    assert summary["iterations"] == 5 * (1438 // 32)  # 5 epochs of the digits training split
    assert summary["final_test_accuracy"] >= 0.95, summary["final_test_accuracy"]
