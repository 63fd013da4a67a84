"""The kinds punchline ships, registered in its own ``punchline.providers`` entry points like any plug-in's.

Only names and paths here: the SDK modules are imported by :meth:`ProviderKind.make` when a worker builds a
provider (see :mod:`punchline.workers.provider`), each kind's offline twin (its simulated wire, in
:mod:`punchline.workers.fake.wires`) by the simulated provider only.
"""

from __future__ import annotations

from punchline.workers.provider import ProviderKind

CHAT_PATH = "/chat/completions"  # relative to base_url: what every openai unit calls (preflight probes it)
MESSAGES_PATH = "/v1/messages"  # the anthropic one

OPENAI = ProviderKind(
    "openai",
    "punchline.workers.providers.openai_http:OpenAIProvider",
    batches="punchline.workers.providers.batch_openai:OpenAIBatches",
    base_url_env="OPENAI_BASE_URL",
    default_base_url="https://api.openai.com/v1",
    key_env="OPENAI_API_KEY",
    models_path="/models",
    call_path=CHAT_PATH,
    env_headers={"OPENAI_ORG_ID": "OpenAI-Organization", "OPENAI_PROJECT_ID": "OpenAI-Project"},
    simulated_wire="punchline.workers.fake.wires.openai:WIRE",
    summary="OpenAI chat completions and every compatible API (Together, vLLM, ...); batch API",
)

ANTHROPIC_VERSION = "2023-06-01"  # the API version header every Anthropic request carries

ANTHROPIC = ProviderKind(
    "anthropic",
    "punchline.workers.providers.anthropic:AnthropicProvider",
    batches="punchline.workers.providers.batch_anthropic:AnthropicBatches",
    base_url_env="ANTHROPIC_BASE_URL",
    default_base_url="https://api.anthropic.com",
    key_env="ANTHROPIC_API_KEY",
    models_path="/v1/models?limit=1",
    call_path=MESSAGES_PATH,
    key_header="x-api-key",
    extra_headers={"anthropic-version": ANTHROPIC_VERSION},
    splits_n=True,  # the Messages API has no n
    simulated_wire="punchline.workers.fake.wires.anthropic:WIRE",
    summary="the Anthropic Messages API; batch API",
)
