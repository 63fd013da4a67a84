"""The deploy files validate: the launcher YAML against Ray's own schema (``ray-schema.json`` in the
installed ray, through its ``prepare_config``/``validate_config``) and each node type's
``node_config`` against EC2's RunInstances input model in botocore; the KubeRay ``RayCluster`` and
``RayJob`` against a structural schema of the CRD fields they use (written from KubeRay's
``ray.io/v1`` types, ``raycluster_types.go``/``rayjob_types.go``: unknown fields, wrong types and
bad enum values fail), since the CRDs are not available offline. Plus the properties the issue asks
for: autoscaling on, a spot worker group beside an on-demand head, a resumable RayJob."""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import shlex
import stat
from pathlib import Path
from typing import Any

import boto3
import jsonschema
import pytest
import yaml
from botocore.validate import ParamValidator

from punchline.cluster.cli.main import build_parser

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
PACKAGE = Path(__file__).resolve().parents[1] / "punchline"


def load(rel: str) -> Any:
    return yaml.safe_load((DEPLOY / rel).read_text())


# --- EC2: Ray's cluster launcher -------------------------------------------------------------------


def test_the_launcher_config_passes_rays_own_validation() -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = load("aws/cluster.yaml")
    validate_config(prepare_config(copy.deepcopy(config)))
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"] == {"CPU": 0}  # the driver's node runs no shard workers
    assert "InstanceMarketOptions" not in head["node_config"]  # on-demand
    spot = [t for t in types.values() if t["node_config"].get("InstanceMarketOptions", {}).get("MarketType") == "spot"]
    assert len(spot) == 1
    assert 0 <= spot[0]["min_workers"] <= spot[0]["max_workers"] <= config["max_workers"]


def _enum_errors(value: Any, shape: Any, path: str) -> list[str]:
    """botocore's ParamValidator checks names and types; this adds the enums (MarketType, ...)."""
    errors = []
    if shape.type_name == "structure" and isinstance(value, dict):
        for name, member in shape.members.items():
            if name in value:
                errors += _enum_errors(value[name], member, f"{path}.{name}")
    elif shape.type_name == "list" and isinstance(value, list):
        for i, item in enumerate(value):
            errors += _enum_errors(item, shape.member, f"{path}[{i}]")
    elif shape.type_name == "string" and getattr(shape, "enum", None) and value not in shape.enum:
        errors.append(f"{path}: {value!r} not in {shape.enum}")
    return errors


def test_every_node_config_is_a_valid_ec2_run_instances_request() -> None:
    shape = boto3.client("ec2", region_name="us-east-1").meta.service_model.operation_model("RunInstances").input_shape
    for name, node_type in load("aws/cluster.yaml")["available_node_types"].items():
        params = dict(node_type["node_config"], MinCount=1, MaxCount=1)  # the launcher adds these
        report = ParamValidator().validate(params, shape)
        assert not report.has_errors(), f"{name}: {report.generate_report()}"
        assert _enum_errors(params, shape, name) == []
    # the check has teeth: a misspelt field and a bad enum value are caught
    bad = {"MinCount": 1, "MaxCount": 1, "InstanceMarketOptions": {"MarketType": "spotty"}}
    assert (
        _enum_errors(bad, shape, "bad")
        and ParamValidator().validate({"MinCount": 1, "MaxCount": 1, "InstanceMarketOption": {}}, shape).has_errors()
    )


def _write_env_module() -> Any:
    spec = importlib.util.spec_from_file_location("write_env", DEPLOY / "aws" / "write_env.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_write_env_takes_its_settings_from_the_launcher_config_and_secrets_from_ssm(
    tmp_path: Path, s3_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_env = _write_env_module()
    config = load("aws/cluster.yaml")
    (command,) = [c for c in config["setup_commands"] if "write_env.py" in c]
    argv = shlex.split(command)
    argv = argv[argv.index(next(a for a in argv if a.endswith("write_env.py"))) + 1 :]
    args = write_env.build_parser().parse_args(argv)
    assert args.store.startswith("s3://") and args.max_workers == config["max_workers"]

    for name, value in {"AWS_ENDPOINT_URL": s3_server, "AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t"}.items():
        monkeypatch.setenv(name, value)  # moto's server answers SSM too
    ssm = boto3.client("ssm", region_name=args.region)
    secrets = {"redis-url": "redis://:pw'x@redis:6379/0", "openai-api-key": "sk-1", "anthropic-api-key": "sk-2"}
    prefix = f"/t{os.getpid()}/"
    for name, value in secrets.items():
        ssm.put_parameter(Name=prefix + name, Value=value, Type="SecureString", Overwrite=True)
    out = tmp_path / "punchline.env"
    write_env.main([*argv, "--ssm-prefix", prefix, "--out", str(out)])
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    text = out.read_text()
    assert f"export PUNCHLINE_STORE='{args.store}'" in text and "export PUNCHLINE_MAX_WORKERS='8'" in text
    assert "export PUNCHLINE_REDIS_URL='redis://:pw'\\''x@redis:6379/0'" in text  # quoted for the shell
    # its settings are its arguments (set in cluster.yaml), never the environment where `ray up` ran
    assert "os.environ" not in (DEPLOY / "aws" / "write_env.py").read_text()


# --- Kubernetes: KubeRay --------------------------------------------------------------------------

STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
QUANTITIES = {"type": "object", "additionalProperties": {"type": ["string", "integer"]}}

ENV_VAR = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "value": {"type": "string"},
        "valueFrom": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "secretKeyRef": {
                    "type": "object",
                    "required": ["name", "key"],
                    "additionalProperties": False,
                    "properties": {"name": {"type": "string"}, "key": {"type": "string"}},
                }
            },
        },
    },
}
CONTAINER = {
    "type": "object",
    "required": ["name", "image"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "image": {"type": "string"},
        "env": {"type": "array", "items": ENV_VAR},
        "ports": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["containerPort"],
                "additionalProperties": False,
                "properties": {"containerPort": {"type": "integer"}, "name": {"type": "string"}},
            },
        },
        "resources": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"requests": QUANTITIES, "limits": QUANTITIES},
        },
        "volumeMounts": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "mountPath"],
                "additionalProperties": False,
                "properties": {"name": {"type": "string"}, "mountPath": {"type": "string"}},
            },
        },
    },
}
NODE_SELECTOR_TERM = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["key", "operator"],
                "additionalProperties": False,
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
            },
        }
    },
}
POD_TEMPLATE = {
    "type": "object",
    "required": ["spec"],
    "additionalProperties": False,
    "properties": {
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["containers"],
            "additionalProperties": False,
            "properties": {
                "serviceAccountName": {"type": "string"},
                "containers": {"type": "array", "minItems": 1, "items": CONTAINER},
                "nodeSelector": STR_MAP,
                "terminationGracePeriodSeconds": {"type": "integer"},
                "tolerations": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "key": {"type": "string"},
                            "operator": {"enum": ["Exists", "Equal"]},
                            "value": {"type": "string"},
                            "effect": {"enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]},
                        },
                    },
                },
                "affinity": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "nodeAffinity": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "requiredDuringSchedulingIgnoredDuringExecution": {
                                    "type": "object",
                                    "required": ["nodeSelectorTerms"],
                                    "additionalProperties": False,
                                    "properties": {"nodeSelectorTerms": {"type": "array", "items": NODE_SELECTOR_TERM}},
                                }
                            },
                        }
                    },
                },
                "volumes": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string"},
                            "configMap": {
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {"name": {"type": "string"}, "optional": {"type": "boolean"}},
                            },
                        },
                    },
                },
            },
        },
    },
}
# RayClusterSpec / HeadGroupSpec / WorkerGroupSpec / AutoscalerOptions of ray.io/v1
RAY_CLUSTER_SPEC = {
    "type": "object",
    "required": ["headGroupSpec"],
    "additionalProperties": False,
    "properties": {
        "rayVersion": {"type": "string"},
        "enableInTreeAutoscaling": {"type": "boolean"},
        "autoscalerOptions": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "upscalingMode": {"enum": ["Default", "Aggressive", "Conservative"]},
                "idleTimeoutSeconds": {"type": "integer"},
                "resources": {"type": "object"},
                "image": {"type": "string"},
                "imagePullPolicy": {"type": "string"},
                "env": {"type": "array", "items": ENV_VAR},
            },
        },
        "headServiceAnnotations": STR_MAP,
        "suspend": {"type": "boolean"},
        "headGroupSpec": {
            "type": "object",
            "required": ["rayStartParams", "template"],
            "additionalProperties": False,
            "properties": {
                "serviceType": {"type": "string"},
                "enableIngress": {"type": "boolean"},
                "rayStartParams": STR_MAP,
                "template": POD_TEMPLATE,
            },
        },
        "workerGroupSpecs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["groupName", "rayStartParams", "template"],
                "additionalProperties": False,
                "properties": {
                    "groupName": {"type": "string"},
                    "replicas": {"type": "integer", "minimum": 0},
                    "minReplicas": {"type": "integer", "minimum": 0},
                    "maxReplicas": {"type": "integer", "minimum": 0},
                    "numOfHosts": {"type": "integer", "minimum": 1},
                    "rayStartParams": STR_MAP,
                    "template": POD_TEMPLATE,
                },
            },
        },
    },
}
METADATA = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}
RAY_CLUSTER = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayCluster"},
        "metadata": METADATA,
        "spec": RAY_CLUSTER_SPEC,
    },
}
RAY_JOB = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayJob"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "entrypoint": {"type": "string"},
                "metadata": STR_MAP,
                "runtimeEnvYAML": {"type": "string"},
                "jobId": {"type": "string"},
                "shutdownAfterJobFinishes": {"type": "boolean"},
                "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
                "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
                "backoffLimit": {"type": "integer", "minimum": 0},
                "submissionMode": {"enum": ["K8sJobMode", "HTTPMode", "InteractiveMode"]},
                "submitterConfig": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"backoffLimit": {"type": "integer", "minimum": 0}},
                },
                "clusterSelector": STR_MAP,
                "suspend": {"type": "boolean"},
                "entrypointNumCpus": {"type": "number"},
                "rayClusterSpec": RAY_CLUSTER_SPEC,
            },
        },
    },
}


def test_the_raycluster_and_the_rayjob_fit_the_kuberay_crd_fields() -> None:
    cluster, job = load("kuberay/raycluster.yaml"), load("kuberay/rayjob.yaml")
    jsonschema.validate(cluster, RAY_CLUSTER)
    jsonschema.validate(job, RAY_JOB)
    assert job["spec"]["rayClusterSpec"] == cluster["spec"]  # one cluster, two ways to run on it
    # the schema has teeth: a misspelt field, a wrong type and a bad enum value all fail
    for path, value in (
        (("spec", "enableInTreeAutoScaling"), True),
        (("spec", "workerGroupSpecs", 0, "maxReplicas"), "8"),
        (("spec", "autoscalerOptions", "upscalingMode"), "Fast"),
    ):
        broken = copy.deepcopy(cluster)
        node = broken
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, RAY_CLUSTER)


def _affinity_terms(pod_spec: dict[str, Any]) -> list[list[dict[str, Any]]]:
    required = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [term["matchExpressions"] for term in required["nodeSelectorTerms"]]


def test_autoscaling_on_and_spot_workers_beside_an_on_demand_head() -> None:
    spec = load("kuberay/raycluster.yaml")["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    (head_term,) = _affinity_terms(head["template"]["spec"])
    assert {"key": "eks.amazonaws.com/capacityType", "operator": "NotIn", "values": ["SPOT"]} in head_term
    assert {"key": "cloud.google.com/gke-spot", "operator": "DoesNotExist"} in head_term
    (spot,) = [g for g in spec["workerGroupSpecs"] if g["groupName"] == "spot"]
    terms = _affinity_terms(spot["template"]["spec"])
    assert [{"key": "eks.amazonaws.com/capacityType", "operator": "In", "values": ["SPOT"]}] in terms
    assert [{"key": "cloud.google.com/gke-spot", "operator": "In", "values": ["true"]}] in terms
    tolerated = {t["key"] for t in spot["template"]["spec"]["tolerations"]}
    assert {"spot", "cloud.google.com/gke-spot"} <= tolerated
    assert spot["minReplicas"] <= spot["replicas"] <= spot["maxReplicas"]
    head_env = {e["name"]: e.get("value") for e in head["template"]["spec"]["containers"][0]["env"]}
    assert int(head_env["PUNCHLINE_MAX_WORKERS"]) == spot["maxReplicas"]  # runs ask for what the group allows


def test_the_rayjob_is_a_resumable_punchline_run_without_secrets() -> None:
    spec = load("kuberay/rayjob.yaml")["spec"]
    assert spec["shutdownAfterJobFinishes"] is False
    assert spec["submitterConfig"]["backoffLimit"] >= 1 and spec["backoffLimit"] >= 1
    argv = shlex.split(spec["entrypoint"])
    assert argv[:3] == ["python", "-m", "punchline"]
    args = build_parser().parse_args(argv[3:])
    assert args.command == "run" and args.config.startswith("/home/ray/punchline/configs/")
    assert args.run_id and args.run_id == spec["metadata"]["punchline_run_id"]  # a retry resumes this run
    assert not re.search(r"://[^/\s]*@|KEY|PASSWORD|TOKEN", spec["entrypoint"], re.IGNORECASE)


def test_every_punchline_variable_the_deploy_files_set_is_one_punchline_reads() -> None:
    source = "\n".join(  # the layer folders are linked into punchline/: walk through the links
        (Path(d) / f).read_text()
        for d, _, files in os.walk(PACKAGE, followlinks=True)
        for f in files
        if f.endswith(".py")
    )
    names: set[str] = set()
    for rel in ("kuberay/raycluster.yaml", "kuberay/rayjob.yaml", "aws/write_env.py"):
        names |= set(re.findall(r"PUNCHLINE_[A-Z0-9_]+", (DEPLOY / rel).read_text()))
    assert names
    for name in names:
        assert f'"{name}"' in source, f"{name} is set by deploy/ but read nowhere"
