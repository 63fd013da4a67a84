"""Pipelines: the stages of each workload, in order."""
