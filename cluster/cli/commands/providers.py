"""``punchline fake-provider``: the offline simulated provider as a foreground server."""

from __future__ import annotations

import argparse
import ipaddress

from punchline.cluster.cli.commands import summary
from punchline.cluster.cli.shared import Subcommands
from punchline.data.errors import ConfigError
from punchline.workers.fake.checks import server_config
from punchline.workers.fake.server import FakeProviderServer


def register(sub: Subcommands) -> None:
    p = sub.add_parser(
        "fake-provider",
        help=summary("fake-provider"),
        description="Serve the fake provider until Ctrl-C: POST /v1/chat/completions (OpenAI) and "
        "/v1/messages (Anthropic), GET /stats, POST /reset, POST /configure (JSON knobs). Answers are "
        "deterministic; faults (429, 5xx, hangs, truncated or empty bodies) are injected per the knobs. "
        "Point a provider at it with base_url = http://127.0.0.1:PORT/v1 (openai) or http://127.0.0.1:PORT "
        "(anthropic).",
    )
    p.add_argument("--port", type=int, default=8700, help="port to listen on (default 8700; 0 = any free port)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--config", help="TOML file of FakeConfig knobs (top-level keys, e.g. error_503_rate = 0.1)")
    p.add_argument(
        "--answer-key",
        action="append",
        metavar="PIPELINE=FILE",
        help="a file whose answers that pipeline's simulated answers know (its answer_key knob; repeatable)",
    )
    p.set_defaults(func=cmd_fake_provider)


def cmd_fake_provider(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"must be a port number 0-65535, got {args.port}", field="--port")
    try:
        ipaddress.ip_address(args.host)
    except ValueError:
        raise ConfigError(f"not an IP address: {args.host!r}", field="--host") from None
    config = server_config(args.config, answer_keys=args.answer_key)
    try:
        server = FakeProviderServer(config, host=args.host, port=args.port)
    except ValueError as exc:  # a pipeline's knobs (pipeline_knobs.<name>) that its simulator refuses
        raise ConfigError(str(exc), file=args.config) from None
    try:
        server.serve_forever(on_ready=lambda url: print(f"fake provider listening on {url}", flush=True))
    except KeyboardInterrupt:
        print("fake provider stopped", flush=True)
    return 0
