"""The viewer's command, as ``punchline --help`` lists it without importing it (a light module: the
``punchline.commands`` entry point names it, as a pipeline's commands are found)."""

COMMANDS: dict[str, tuple[str, str]] = {  # command -> (the module that registers it, its one-line help)
    "view": (
        "punchline.viewer.command",
        "a local web page: runs, a run's progress and artifacts, every unit's answers",
    ),
}
