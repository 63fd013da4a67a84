"""punchline's ground floor: what every other floor speaks.

- The shared vocabulary, storage and settings are this package's modules and ``stores/``: requests and
  responses (``requests.py``), unit specs, results and stage manifests (``units.py``), the run's layout in a
  store (``run_layout.py``), errors, settings, the store interface and its implementations.
- A pipeline's own data code (loaders, schemas, scoring) lives in its folder (``pipelines/<name>/data/``), not
  here: the engine and the vocabulary never import it (``tests/test_layers.py``).
- ``samples/`` holds the small original inputs the demos run on.
"""
