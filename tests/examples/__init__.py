"""Tests of the shipped examples (examples/), each run as a user runs it."""
