"""Kubernetes: the plan as a ConfigMap and two jobs that run gplan's torch worker on every node —
a Kubeflow training-operator v1 `PyTorchJob` (one Master, the other nodes Workers) and a Kubeflow
Trainer v2 `TrainJob` on the `torch-distributed` ClusterTrainingRuntime. Apply the ConfigMap and one
of the two.

Each pod runs torchrun with c10d rendezvous at the address the operator injects (MASTER_ADDR and
MASTER_PORT for v1, PET_MASTER_ADDR and PET_MASTER_PORT for v2), the launch recipe's environment, and
the plan mounted at /plan/plan.json. Resources are named and labelled by the plan's layout digest, so
two plans of one model never overwrite each other's job. The image is the user's (`--image`): one with
gplan and the pinned torch installed.

A plan whose stages need different hardware cannot be one PyTorchJob (one pod template for every
worker): it becomes one Indexed Job per node group behind a headless Service, each pod selected onto its
group's nodes (`nodeSelector` on the `gplan/hardware` label — label your nodes with it) and given a
node rank of its group from its completion index; torchrun's static rendezvous keeps those ranks and
meets at node rank 0's pod.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gplan.backends.exporters import Export, ExportContext, stamp
from gplan.backends.protocol import JobRecipe, LaunchOptions
from gplan.backends.recipes import TORCHRUN_PORT, default_nodes, node_ranks_by_group, shell_words, torchrun_argv
from gplan.backends.torch.launcher import check_hardware, job_env, notes as launch_notes, worker_args
from gplan.errors import InputError
from gplan.plan import Plan

VERSIONS = {"v1.9+v2.3": "Kubeflow training-operator v1.9 (kubeflow.org/v1 PyTorchJob) and Kubeflow Trainer v2.3 "
                         "(trainer.kubeflow.org/v1alpha1 TrainJob)"}

TITLE = "Kubernetes (Kubeflow PyTorchJob and TrainJob)"
"""How its users call it (docs/exporting.md's table)."""
EXACT = (
    "gplan's torch worker as `gplan launch` runs it, as a PyTorchJob and a TrainJob: the launch recipe's "
    "environment, its notes (as the `gplan/notes` annotation), resources named and labelled by the layout "
    "digest, the image you give; a plan whose stages need different hardware becomes one Indexed Job per node"
    " group behind a headless Service (`nodeSelector` on the `gplan/hardware` label, node rank from the "
    "completion index, torchrun's static rendezvous)")
"""What its files run exactly as the plan priced it (docs/exporting.md's table, from bench/engine_tables.py)."""
APPROXIMATED = (
    "what the torch worker refuses is refused here too, and so is a plan priced on Ascend devices (the worker"
    " would train on the host CPUs)")
"""What it runs differently or refuses."""

DEVICE_RESOURCE = {"gpu": "nvidia.com/gpu", "cpu": "cpu"}
"""What a pod asks for, per hardware kind the torch worker runs (torch.launcher.RUNS_ON; check_hardware refuses
the rest): the NVIDIA device plugin's extended resource, or CPUs."""

PLAN_DIR = "/plan"
TRAINER_RUNTIME = "torch-distributed"
"""The ClusterTrainingRuntime Kubeflow Trainer installs for PyTorch; its replicated job and container
are both named `node`."""


def export(plan: Plan, context: ExportContext) -> Export:
    check_hardware(plan, "auto", "the Kubernetes export (PyTorchJob, TrainJob)",
                   "run it with MindSpore: gplan launch PLAN --backend mindspore --slurm job.sh, or gplan export "
                   "PLAN --to mindformers")
    if not context.image:
        raise InputError("the Kubernetes export needs the container image its pods run",
                         hint="add --image REGISTRY/IMAGE:TAG (an image with gplan and torch==2.13.0 installed)")
    found = launch_notes(plan)
    header = stamp(plan, context.version) + "".join(f"\n# note: {n}" for n in context.notes + found)
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": config_map_name(plan), "labels": labels(plan)},
                  "data": {"plan.json": plan.model_dump_json(indent=2)}}
    if len({s.node_group for s in plan.stages}) > 1:
        groups = "".join(f"\n# node group {g}: label its nodes {HARDWARE_LABEL}={plan.cluster.node_groups[g].hardware.name}"
                         for g in sorted({s.node_group for s in plan.stages}))
        documents = [hetero_service(plan), *hetero_jobs(plan, context.image)]
        return Export({"plan-configmap.yaml": header + "\n" + yaml.safe_dump(config_map, sort_keys=False),
                       "node-group-jobs.yaml": header + groups + "\n" + yaml.safe_dump_all(documents, sort_keys=False)},
                      found)
    files = {"plan-configmap.yaml": header + "\n" + yaml.safe_dump(config_map, sort_keys=False),
             "pytorchjob.yaml": header + "\n" + yaml.safe_dump(pytorchjob(plan, context.image, found), sort_keys=False),
             "trainjob.yaml": header + "\n" + yaml.safe_dump(trainjob(plan, context.image, found), sort_keys=False)}
    return Export(files, found)


def labels(plan: Plan) -> dict[str, str]:
    return {"gplan/plan-digest": plan.layout_digest, "gplan/inputs-digest": plan.digest}


def annotations(notes: list[str]) -> dict[str, str]:
    return {"gplan/notes": "; ".join(notes)} if notes else {}


def resources(plan: Plan, per_node: int) -> dict:
    return resources_of(plan.cluster.primary, per_node)


def command(plan: Plan, endpoint: str) -> list[str]:
    nnodes, per_node = default_nodes(plan)
    program = worker_args(Path(PLAN_DIR) / "plan.json", LaunchOptions(run_dir=Path("/runs/gplan")))
    return torchrun_argv(JobRecipe(nnodes, per_node, program), endpoint=endpoint, separator="=")


def env(plan: Plan) -> list[dict]:
    return [{"name": k, "value": v} for k, v in sorted(job_env(plan).items())]


def pytorchjob(plan: Plan, image: str, notes: list[str]) -> dict:
    nnodes, per_node = default_nodes(plan)
    pod = {"spec": {"containers": [{
        "name": "pytorch", "image": image, "command": command(plan, "$(MASTER_ADDR):$(MASTER_PORT)"),
        "env": env(plan), "resources": resources(plan, per_node),
        "volumeMounts": [{"name": "plan", "mountPath": PLAN_DIR}]}],
        "volumes": [{"name": "plan", "configMap": {"name": config_map_name(plan)}}]}}
    replicas = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": pod}}
    if nnodes > 1:
        replicas["Worker"] = {"replicas": nnodes - 1, "restartPolicy": "Never", "template": pod}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": job_name(plan), "labels": labels(plan), "annotations": annotations(notes)},
            "spec": {"nprocPerNode": str(per_node), "runPolicy": {"backoffLimit": 0},
                     "pytorchReplicaSpecs": replicas}}


def trainjob(plan: Plan, image: str, notes: list[str]) -> dict:
    nnodes, per_node = default_nodes(plan)
    mount = {"name": "node", "volumeMounts": [{"name": "plan", "mountPath": PLAN_DIR}]}
    pod = {"spec": {"volumes": [{"name": "plan", "configMap": {"name": config_map_name(plan)}}], "containers": [mount]}}
    patch = {"manager": "gplan", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": pod}}}]}}}}
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": job_name(plan), "labels": labels(plan), "annotations": annotations(notes)},
            "spec": {"runtimeRef": {"name": TRAINER_RUNTIME, "kind": "ClusterTrainingRuntime",
                                    "apiGroup": "trainer.kubeflow.org"},
                     "trainer": {"image": image, "command": command(plan, "$(PET_MASTER_ADDR):$(PET_MASTER_PORT)"),
                                 "numNodes": nnodes, "numProcPerNode": per_node, "env": env(plan),
                                 "resourcesPerNode": resources(plan, per_node)},
                     "runtimePatches": [patch]}}


HARDWARE_LABEL = "gplan/hardware"
"""The node label the per-group jobs select on (its value: the group's hardware name)."""


def hetero_service(plan: Plan) -> dict:
    """The headless Service that gives every pod a DNS name (`<job>-<index>.<service>`)."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": job_name(plan), "labels": labels(plan)},
            "spec": {"clusterIP": "None", "selector": {"gplan/job": job_name(plan)},
                     "ports": [{"name": "rendezvous", "port": TORCHRUN_PORT}]}}


def hetero_jobs(plan: Plan, image: str) -> list[dict]:
    """One Indexed Job per node group; pod `index` of group g runs node rank ranks_g[index]."""
    _, per_node = default_nodes(plan)
    by_group = node_ranks_by_group(plan, per_node)
    head_group = next(g for g, ranks in by_group.items() if 0 in ranks)
    head = f"{group_job_name(plan, head_group)}-0.{job_name(plan)}"  # node rank 0: its group's first pod
    program = worker_args(Path(PLAN_DIR) / "plan.json", LaunchOptions(run_dir=Path("/runs/gplan")))
    job = JobRecipe(sum(map(len, by_group.values())), per_node, program)
    argv = torchrun_argv(job, node_rank="$NODE_RANK", endpoint=f"{head}:{TORCHRUN_PORT}")
    jobs = []
    for g, ranks in by_group.items():
        # POSIX sh: the index-th of the group's node ranks
        script = f"set -- {' '.join(map(str, ranks))}; shift \"$JOB_COMPLETION_INDEX\"; NODE_RANK=$1; exec {shell_words(argv)}"
        group = plan.cluster.node_groups[g]
        pod = {"metadata": {"labels": {**labels(plan), "gplan/job": job_name(plan)}},
               "spec": {"subdomain": job_name(plan), "restartPolicy": "Never",
                        "nodeSelector": {HARDWARE_LABEL: group.hardware.name},
                        "containers": [{"name": "gplan", "image": image, "command": ["sh", "-c", script],
                                        "env": env(plan), "resources": resources_of(group, per_node),
                                        "ports": [{"containerPort": TORCHRUN_PORT}],
                                        "volumeMounts": [{"name": "plan", "mountPath": PLAN_DIR}]}],
                        "volumes": [{"name": "plan", "configMap": {"name": config_map_name(plan)}}]}}
        jobs.append({"apiVersion": "batch/v1", "kind": "Job",
                     "metadata": {"name": group_job_name(plan, g), "labels": labels(plan)},
                     "spec": {"completionMode": "Indexed", "completions": len(ranks), "parallelism": len(ranks),
                              "backoffLimit": 0, "template": pod}})
    return jobs


def group_job_name(plan: Plan, group: int) -> str:
    """Short: an Indexed Job's pods are named `<job>-<index>`, a DNS label of at most 63 characters."""
    return f"gplan-{plan.layout_digest[:10]}-g{group}"


def resources_of(group, per_node: int) -> dict:
    """The device plugin's resource a pod of `group` asks for, one per process."""
    return {"limits": {DEVICE_RESOURCE[group.hardware.kind]: per_node}}


def job_name(plan: Plan) -> str:
    """A DNS-1123 name: lower case, digits and dashes, the layout's digest at the end — every plan of one
    model gets its own job."""
    base = re.sub(r"[^a-z0-9]+", "-", plan.model.name.lower()).strip("-") or "model"
    suffix = plan.layout_digest[:10]
    # 58 characters at most, so that the ConfigMap's `<job>-plan` stays within 63.
    return f"gplan-{base[:58 - len(suffix) - 7].rstrip('-')}-{suffix}"


def config_map_name(plan: Plan) -> str:
    return job_name(plan) + "-plan"
