"""The generic prompts pipeline's pure data code: its settings, row loaders, templates, parsers and outputs.

A researcher's everyday job — a file of rows, a prompt template over each row's fields, several models
x n samples, an optional parse step and an optional judge — as data with no engine in it, so it can be
tested (and reused) without Redis or Ray. ``cluster/pipelines/prompts/`` turns it into stages.
"""
