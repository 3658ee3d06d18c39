"""Typed records shared by every layer; imports nothing of ours."""
