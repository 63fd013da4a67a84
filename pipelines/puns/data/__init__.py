"""The Puns workflow's data: its schemas, loaders, completions, classification, tiers, cloze tests and curation."""
