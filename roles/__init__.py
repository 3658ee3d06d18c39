"""LLM roles: one module per role, each an async function that renders its prompt, asks its model and returns a
typed answer with the call's usage (graph nodes call them); `roles.models` is the model seam they all share."""
