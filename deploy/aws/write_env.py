"""Run on every node by deploy/aws/cluster.yaml: write ~/punchline.env (mode 0600) from SSM.

Secrets live in SSM Parameter Store (SecureString) and reach only this file, which `ray start`
sources so that the dashboard, the drivers of submitted jobs and every Ray worker inherit them;
nothing secret is in the YAML. The non-secret settings are this script's arguments, given in
cluster.yaml's setup_commands (which run on the nodes: the environment of `ray up` does not reach
them).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="write ~/punchline.env from SSM Parameter Store")
    p.add_argument("--region", required=True, help="AWS region of the bucket and the SSM parameters")
    p.add_argument("--store", required=True, help="s3://bucket/prefix every node writes to")
    p.add_argument("--ssm-prefix", default="/punchline/", help="SSM parameter path prefix (default /punchline/)")
    p.add_argument("--max-workers", type=int, default=0, help="worker nodes a run may ask the autoscaler for")
    p.add_argument("--out", default="~/punchline.env", help="file to write (default ~/punchline.env)")
    return p


def environment(args: argparse.Namespace, param: Callable[[str], str]) -> dict[str, str]:
    """The variables written; ``param(name)`` reads one SSM parameter (decrypted)."""
    return {
        "AWS_DEFAULT_REGION": args.region,
        "PUNCHLINE_STORE": args.store,
        "PUNCHLINE_RAY_ADDRESS": "auto",
        "PUNCHLINE_MAX_WORKERS": str(args.max_workers),
        "RAY_JOB_STOP_WAIT_TIME_S": "30",  # `punchline stop`: time for the driver to stop its workers cleanly
        "PUNCHLINE_REDIS_URL": param("redis-url"),
        "OPENAI_API_KEY": param("openai-api-key"),
        "ANTHROPIC_API_KEY": param("anthropic-api-key"),
    }


def main(argv: Sequence[str] | None = None) -> None:
    import boto3

    args = build_parser().parse_args(argv)
    ssm = boto3.client("ssm", region_name=args.region)

    def param(name: str) -> str:
        return str(ssm.get_parameter(Name=args.ssm_prefix + name, WithDecryption=True)["Parameter"]["Value"])

    env = environment(args, param)
    path = os.path.expanduser(args.out)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        for key, value in env.items():
            escaped = value.replace("'", "'\\''")
            fh.write(f"export {key}='{escaped}'\n")
    os.chmod(path, 0o600)  # also when the file existed with other permissions
    print(f"wrote {path} ({', '.join(env)})")


if __name__ == "__main__":
    main()
