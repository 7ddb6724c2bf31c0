"""The errors a user's input can cause: the bottom layer, imported by every other one and importing none."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range."""


class DatasetError(ValueError):
    """A dataset file is missing, truncated or not in the expected format."""
