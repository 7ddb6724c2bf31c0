"""Shared fixtures: small configs and run directories."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "configs")
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture
def configs_dir() -> str:
    return CONFIGS
