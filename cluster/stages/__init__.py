"""The generic stages a study composes (generate rows x models x n samples, parsed; judge each answer), with their
settings, row loaders, templates, parsers and output files: what the built-in ``prompts`` pipeline registers and what
a plug-in's ``Generate``/``Judge`` stages run. Engine code: it names no pipeline."""
