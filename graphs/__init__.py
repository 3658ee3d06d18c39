"""Composition roots: graphs, the programmatic API and the `hera` CLI."""
