"""Harness bundles: format, hook ABI, loader and the baseline bundles."""
