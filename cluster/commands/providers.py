"""``punchline fake-provider``: the offline simulated LLM provider as a foreground server."""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from data.errors import ConfigError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "fake-provider",
        help="serve the simulated LLM provider (OpenAI + Anthropic APIs) on 127.0.0.1",
        description="Serve the fake provider until Ctrl-C: POST /v1/chat/completions (OpenAI) and "
        "/v1/messages (Anthropic), GET /stats, POST /reset, POST /configure (JSON knobs). Answers are "
        "deterministic; faults (429, 5xx, hangs, truncated or empty bodies) are injected per the knobs. "
        "Point a provider at it with base_url = http://127.0.0.1:PORT/v1 (openai) or http://127.0.0.1:PORT "
        "(anthropic).",
    )
    p.add_argument("--port", type=int, default=8700, help="port to listen on (default 8700; 0 = any free port)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--config", help="TOML file of FakeConfig knobs (top-level keys, e.g. error_503_rate = 0.1)")
    p.add_argument("--puns", action="append", help="puns JSON file the fake answers from (repeatable)")
    p.set_defaults(func=cmd_fake_provider)


def cmd_fake_provider(args: argparse.Namespace) -> int:
    from workers.fake.server import FakeConfig, FakeProviderServer, load_config

    config = FakeConfig()
    if args.config:
        try:
            config = load_config(args.config)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ConfigError(str(exc), file=args.config) from None
    if args.puns:
        config = msgspec.structs.replace(config, puns_path=list(args.puns))
    server = FakeProviderServer(config, host=args.host, port=args.port)
    try:
        server.serve_forever(on_ready=lambda url: print(f"fake provider listening on {url}", flush=True))
    except KeyboardInterrupt:
        print("fake provider stopped", flush=True)
    return 0
