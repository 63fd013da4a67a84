"""Figures any pipeline draws: one drawing lock per process (matplotlib's state is process-wide), and a cache
that copies a figure drawn before from the same input instead of drawing it again."""
