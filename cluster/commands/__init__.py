"""Sub-command families of the punchline CLI (one module each)."""
