"""``python -m punchline``: the same CLI as the ``punchline`` script."""

from punchline.cluster.cli import entry

entry()
