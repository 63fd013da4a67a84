"""punchline schedulers."""
