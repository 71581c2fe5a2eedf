"""Kubernetes: a Kubeflow training-operator `PyTorchJob` (one Master, the other nodes as Workers),
each pod running gplan's torchrun command for its node. The operator sets the rendezvous variables
(MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK = node rank, PET_NNODES); the container reads them."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gplan.backends.exporters import Export, stamp
from gplan.backends.launch import JobRecipe, LaunchOptions, default_nodes, torchrun_argv
from gplan.backends.torch.launcher import job_env, worker_args
from gplan.plan import Plan

DEVICE_RESOURCE = {"gpu": "nvidia.com/gpu", "npu": "huawei.com/Ascend910"}
"""Extended resource names of the NVIDIA and Ascend device plugins."""


def export(plan: Plan, image: str = "gplan:latest") -> Export:
    nnodes, per_node = default_nodes(plan)
    kind = plan.cluster.primary.hardware.kind
    resources = {DEVICE_RESOURCE[kind]: per_node} if kind in DEVICE_RESOURCE else {"cpu": per_node}
    program = worker_args(Path("/plan/plan.json"), LaunchOptions(run_dir=Path("/runs/gplan")))
    job = JobRecipe(nnodes, per_node, program, job_env(plan))
    command = torchrun_argv(job, endpoint="$(MASTER_ADDR):$(MASTER_PORT)", separator="=")
    pod = {"spec": {"containers": [{
        "name": "pytorch", "image": image, "command": command,
        "env": [{"name": k, "value": v} for k, v in sorted(job.env.items())],
        "resources": {"limits": resources},
        "volumeMounts": [{"name": "plan", "mountPath": "/plan"}]}],
        "volumes": [{"name": "plan", "configMap": {"name": _name(plan) + "-plan"}}]}}
    replicas = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": pod}}
    if nnodes > 1:
        replicas["Worker"] = {"replicas": nnodes - 1, "restartPolicy": "Never", "template": pod}
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {"name": _name(plan), "labels": {"gplan/inputs-digest": plan.digest,
                                                               "gplan/plan-digest": plan.layout_digest}},
           "spec": {"nprocPerNode": str(per_node), "pytorchReplicaSpecs": replicas}}
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": _name(plan) + "-plan"},
                  "data": {"plan.json": plan.model_dump_json(indent=2)}}
    text = stamp(plan) + "\n" + yaml.safe_dump_all([config_map, job], sort_keys=False)
    return Export({"pytorchjob.yaml": text})


def _name(plan: Plan) -> str:
    """A DNS-1123 name: lower case, digits and dashes."""
    base = re.sub(r"[^a-z0-9-]+", "-", plan.model.name.lower()).strip("-")
    # The layout's digest, not the inputs': every plan of one model gets its own job and ConfigMap.
    suffix = plan.layout_digest[:10]
    return f"gplan-{base[:63 - len(suffix) - 7]}-{suffix}".replace("--", "-")
