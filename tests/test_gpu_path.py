"""The GPU path on a machine without one: device allocation, device selection and the GPU check's machinery."""

from __future__ import annotations

import os
import re

import pytest
import torch

from psframework.arrays import allocate
from psframework.bench import gpu


def test_receive_buffers_are_allocated_on_the_transports_device():
    from mpi4py import MPI

    from psframework.comm import Transport

    assert allocate("float32", (2, 3), "meta").device.type == "meta"
    assert allocate("int64", (4,), None).device.type == "cpu" and allocate("int64", (4,), "cpu").shape == (4,)
    transport = Transport(MPI.COMM_SELF, timeout_s=5, device="meta")
    try:
        out = transport.receives.allocate("float16", (5, 1))
        assert out.device.type == "meta" and out.dtype == torch.float16 and tuple(out.shape) == (5, 1)
    finally:
        transport.close()


def test_the_problem_is_built_on_the_configured_device(monkeypatch):
    from psframework.schemes import common
    from psframework.schemes.validate import load_run, make_settings

    monkeypatch.setattr(common, "resolve_device", lambda name: torch.device("meta"))
    dataset, model = common.build_problem(make_settings(load_run(None, ["device=cuda"])))
    assert dataset.train.images.device.type == "meta" and dataset.test.labels.device.type == "meta"
    assert {p.device.type for p in model.parameters()} == {"meta"}


@pytest.mark.mpi
@pytest.mark.timeout(400)
def test_the_gpu_check_runs_its_checks_and_writes_its_report_on_the_cpu(tmp_path):
    status = gpu.main(["--device", "cpu", "--quick", "--out", str(tmp_path), "--max-size", str(1 << 20)])
    report = (tmp_path / "gpu.md").read_text()
    assert status == 0, report
    for check in ("| ps | pass |", "| stanza | pass |", "| relay integer view | pass |",
                  "| codec on device vs host | pass |"):
        assert check in report, report
    assert "| host | 1 |" in report and "| cpu | 1 |" in report, report
    assert re.search(r"^\| ps \| \d+\.\d{4} \|", report, re.M) and "FAIL" not in report, report


def test_the_gpu_check_script_is_one_command(tmp_path):
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hpc", "gpu-check.sh")
    with open(path) as fh:
        text = fh.read()
    assert os.access(path, os.X_OK) and text.startswith("#!/usr/bin/env bash")
    assert 'exec "$python" -m psframework.bench.gpu "$@"' in text
