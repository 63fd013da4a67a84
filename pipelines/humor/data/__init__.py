"""The Humor benchmark (MERA format): schemas, loaders, validation, prompts, answer parsing, metrics,
the LLM judge and reports. Running it on the engine lives in ``cluster.pipelines.humor``."""
