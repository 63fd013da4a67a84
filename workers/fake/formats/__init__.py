"""Simulated answers in a stage's own format: text a regex's named groups match, JSON valid against a schema."""
