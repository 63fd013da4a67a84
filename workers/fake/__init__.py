"""The offline simulated provider: a real HTTP server speaking every installed provider kind's simulated wire
(OpenAI's and Anthropic's among them, a plug-in kind's too); the installed pipelines answer their own requests
(their ``simulate`` hooks), the rest is answered generically.

The server is :mod:`punchline.workers.fake.server`; this package imports none of it: a run against real endpoints
imports the package for its config checks (``checks``) and never starts the server, whose modules (its HTTP
stack, the formats' JSON Schema validator) would be some 20 MB in the driver and in every worker forked from it.
A run that simulates loads the server through :mod:`punchline.workers.fake.for_run`.
"""
