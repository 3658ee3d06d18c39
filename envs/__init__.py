"""Environment runtime: specs, per-episode state, tools, mutations, verifiers, certification."""
