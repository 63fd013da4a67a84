"""punchline data."""
