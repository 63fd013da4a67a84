"""An example punchline pipeline: a model labels each review's sentiment, a judge checks each label."""
