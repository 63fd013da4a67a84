"""punchline workers."""
