"""LLM roles: one module per role, one async node each; `roles.models` is the model seam they all share."""
