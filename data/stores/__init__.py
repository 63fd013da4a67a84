"""punchline data/stores."""
