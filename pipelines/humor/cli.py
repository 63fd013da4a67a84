"""The Humor pipeline's commands, as ``punchline --help`` lists them without importing them (a light module: the
``punchline.commands`` entry point names it)."""

COMMANDS: dict[str, tuple[str, str]] = {  # command -> (the module that registers it, its one-line help)
    "humor": (
        "punchline.pipelines.humor.commands",
        "Humor benchmark (MERA): validate data, score answers, run a model",
    ),
}
