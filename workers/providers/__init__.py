"""Provider implementations."""
