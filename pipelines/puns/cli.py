"""The Puns pipeline's commands, as ``punchline --help`` lists them without importing them (a light module: the
``punchline.commands`` entry point names it)."""

COMMANDS: dict[str, tuple[str, str]] = {  # command -> (the module that registers it, its one-line help)
    "puns": (
        "punchline.pipelines.puns.commands",
        "Puns 205: validate, rank (tiers), build cloze tests, score cloze answers",
    ),
    "import-legacy": (
        "punchline.pipelines.puns.commands",
        "load upstream checkpoints (completions, verdicts, cloze answers) into the response cache",
    ),
}
