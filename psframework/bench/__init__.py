"""Benchmarks: psf bench NAME."""
