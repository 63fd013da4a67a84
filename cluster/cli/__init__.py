"""The ``punchline`` command: its entry point, what its command families share, and the families (``commands/``)."""
