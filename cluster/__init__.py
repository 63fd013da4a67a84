"""punchline cluster."""
