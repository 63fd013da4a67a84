"""punchline's ground floor: what every other floor speaks, and each pipeline's own data code, kept apart.

- The shared vocabulary, storage and settings are this package's modules and ``stores/``: requests and
  responses (``requests.py``), unit specs, results and stage manifests (``units.py``), the run's layout in a
  store (``run_layout.py``), errors, settings, the store interface and its implementations.
- Each built-in pipeline's data code is a package of its own (``puns/``, ``humor/``, ``prompts/``): loaders,
  schemas, tiers, cloze, Humor's scoring. Only pipelines (and the plug-in facade) import it; the engine and
  the vocabulary never do, and one pipeline's data never imports another's (``tests/test_layers.py``).
- ``samples/`` holds the small original inputs the demos run on.
"""
