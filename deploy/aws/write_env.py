"""Run on every node by deploy/aws/cluster.yaml: write ~/punchline.env (mode 0600) from SSM.

Secrets live in SSM Parameter Store (SecureString) and reach only this file, which `ray start`
sources so that the driver and every Ray worker inherit them; nothing secret is in the YAML.
Region, bucket and parameter names can be overridden through the environment of `ray up`.
"""

import os

import boto3

REGION = os.environ.get("PUNCHLINE_AWS_REGION", "us-east-1")
STORE = os.environ.get("PUNCHLINE_STORE", "s3://my-bucket/punchline")
PREFIX = os.environ.get("PUNCHLINE_SSM_PREFIX", "/punchline/")

ssm = boto3.client("ssm", region_name=REGION)


def param(name: str) -> str:
    return ssm.get_parameter(Name=PREFIX + name, WithDecryption=True)["Parameter"]["Value"]


env = {
    "AWS_DEFAULT_REGION": REGION,
    "PUNCHLINE_STORE": STORE,
    "PUNCHLINE_RAY_ADDRESS": "auto",
    "PUNCHLINE_REDIS_URL": param("redis-url"),
    "OPENAI_API_KEY": param("openai-api-key"),
    "ANTHROPIC_API_KEY": param("anthropic-api-key"),
}
path = os.path.expanduser("~/punchline.env")
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
with os.fdopen(fd, "w") as fh:
    for key, value in env.items():
        escaped = value.replace("'", "'\\''")
        fh.write(f"export {key}='{escaped}'\n")
print(f"wrote {path} ({', '.join(env)})")
