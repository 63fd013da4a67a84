"""``python -m punchline``: the same CLI as the ``punchline`` script."""

from punchline.cluster.cli.main import entry

entry()
