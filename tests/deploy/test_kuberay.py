"""The KubeRay manifests can run the jobs they queue: the RayCronJob is valid against KubeRay 1.6.2's own CRD schema
(``kuberay_1.6.2_raycronjob.json``: its openAPIV3Schema, descriptions dropped and pod templates left open; no field
the schema does not know), its GPU worker group holds the largest queued job, every Ray pod has a memory-backed
/dev/shm, Ray's token authentication is on, and the queued jobs are the API's valid jobs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from tuner.requests.job import JobRequest

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy" / "kuberay" / "rayjob-nightly.yaml"
SCHEMA = json.loads((Path(__file__).with_name("kuberay_1.6.2_raycronjob.json")).read_text())


def documents() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc}


def unknown_fields(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields of ``value`` the schema does not declare (the API server would drop them without a word)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(value, dict) and "properties" in schema:
        found = []
        for key, item in value.items():
            if key not in schema["properties"]:
                found.append(f"{path}.{key}")
            else:
                found += unknown_fields(item, schema["properties"][key], f"{path}.{key}")
        return found
    if isinstance(value, list) and "items" in schema:
        return [field for index, item in enumerate(value) for field in unknown_fields(item, schema["items"], path)]
    return []


def cluster() -> dict[str, Any]:
    return documents()["RayCronJob"]["spec"]["jobTemplate"]["rayClusterSpec"]


def test_the_raycronjob_is_valid_against_kuberays_crd_schema() -> None:
    cron = documents()["RayCronJob"]
    assert cron["apiVersion"] == f"{SCHEMA['group']}/{SCHEMA['version']}" and cron["kind"] == SCHEMA["kind"]
    jsonschema.validate(cron, SCHEMA["schema"])
    assert unknown_fields(cron, SCHEMA["schema"]) == []
    assert "KubeRay >= 1.6" in MANIFEST.read_text()  # RayCronJob and authOptions first ship in 1.6


def test_the_gpu_workers_hold_the_largest_queued_job() -> None:
    queued = json.loads(documents()["ConfigMap"]["data"]["nightly-jobs.json"])
    assert queued == json.loads((ROOT / "deploy" / "nightly-jobs.json").read_text())  # one job list
    groups = [group for group in cluster()["workerGroupSpecs"] if _gpus(group) > 0]
    autoscaling = cluster().get("enableInTreeAutoscaling", False)
    for job in queued:
        JobRequest.model_validate(job)  # a job the API would queue
        nodes, gpus = job["workload"].get("nodes", 1), job["workload"]["gpus"]
        able = [
            group
            for group in groups
            if _gpus(group) >= gpus and group["maxReplicas"] >= nodes and (autoscaling or group["replicas"] >= nodes)
        ]
        assert able, f"{job['study']}: {nodes} node(s) of {gpus} GPUs; the GPU workers cannot hold it"


def test_every_ray_pod_has_a_memory_backed_dev_shm_and_token_auth() -> None:
    assert cluster()["authOptions"]["mode"] == "token"
    pods = [cluster()["headGroupSpec"]["template"]] + [group["template"] for group in cluster()["workerGroupSpecs"]]
    for pod in pods:
        volumes = {volume["name"]: volume for volume in pod["spec"].get("volumes", [])}
        for container in pod["spec"]["containers"]:
            mounts = {mount["mountPath"]: mount["name"] for mount in container.get("volumeMounts", [])}
            assert "/dev/shm" in mounts, container["name"]
            assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"


def _gpus(group: dict[str, Any]) -> int:
    limits = [c.get("resources", {}).get("limits", {}) for c in group["template"]["spec"]["containers"]]
    return sum(int(limit.get("nvidia.com/gpu", 0)) for limit in limits)
