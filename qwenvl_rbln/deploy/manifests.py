"""The Kubernetes objects of one model server: a Deployment of identical replicas, its Service, and (with DRA) the
ResourceClaimTemplate each replica's claim is made from. Plain data with ``Note``s where a reason belongs.

The shape follows llm-d's Rebellions overlay (``guides/optimized-baseline/modelserver/npu/vllm/patch-vllm.yaml`` and
``base/resource-claim-template.yaml`` in llm-d/llm-d): Recreate, a long startup probe with the progress deadline to
match, /dev/shm and a compile-cache volume; every number in it is this artifact's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from qwenvl_rbln.deploy.options import DEVICE_CLASS, DEVICE_RESOURCE, DEVICE_RESOURCE_NOTE, PORT, DeployOptions
from qwenvl_rbln.deploy.pod import PodLaunch, api_key_env
from qwenvl_rbln.deploy.sizing import CACHE_GIB, PROBE_DELAY_S, PROBE_PERIOD_S, PULL_S, SHM_GIB
from qwenvl_rbln.deploy.yamltext import Note
from qwenvl_rbln.serving.public_routes import describe as public_rule

CACHE_ROOT = "/cache/vllm"
HEALTH = "/health"  # one of the public routes (serving/public_routes.py): it answers without the API key
# What the API key guards: qvl's key guard on serve's line (serving/key_guard.py) requires it on every route but the
# public ones; vLLM 0.22 alone guards only /v1, /v2 and /inference (and answers /invocations without the key)
KEY_GUARDS = f"{public_rule()}, through qvl's key guard on the serve line"
# vLLM's timeout for the engine's ready message (default 600 s); vLLM 0.22 with one API server waits for the model
# load itself without a deadline (v1/engine/utils.py wait_for_engine_startup) and times only the later handshake
ENGINE_READY_ENV = "VLLM_ENGINE_READY_TIMEOUT_S"


@dataclass
class Spec:
    """Everything the objects are made from, decided before any is built."""

    opts: DeployOptions
    name: str
    pod: PodLaunch
    image: str
    secret: str
    labels: dict[str, str]  # on every object and the pod template
    selector: dict[str, str]  # the Deployment's and Service's selector (a subset of labels)
    volume: Any
    mount: dict[str, Any]
    init: list
    budget: dict[str, Any]
    resources: dict[str, Any]
    npu: str | None  # the NPU the graphs were compiled for
    graph_hash: str | None = None  # manifest.graph_hash of the artifact, computed once (load time, timings)

    @property
    def npu_family(self) -> str | None:
        return npu_family(self.npu)


def npu_family(npu: str | None) -> str | None:
    """``RBLN-CR13`` -> ``RBLN-CR``: the product family a graph compiled for ``npu`` runs on (llm-d's overlay filters
    Rebel100 the same way, on the productName prefix)."""
    m = re.match(r"(RBLN-[A-Z]+)", npu or "")
    return m.group(1) if m else None


def claim_template(spec: Spec) -> dict[str, Any]:
    n = spec.pod.devices
    request: dict[str, Any] = {"deviceClassName": DEVICE_CLASS, "count": n}
    if spec.npu_family:
        request["selectors"] = [
            Note(
                {
                    "cel": {
                        "expression": f'device.attributes["{DEVICE_CLASS}"].productName.startsWith("{spec.npu_family}")'
                    }
                },
                f"The graphs were compiled for {spec.npu}; one DeviceClass covers every Rebellions product, so "
                f"only this filter keeps the claim on {spec.npu_family} NPUs (productName has no domain prefix).",
            )
        ]
    why = (
        "The LM and the ViT share one NPU (as compiled): one device per replica."
        if n == 1
        else f"The artifact places its graphs on {n} NPUs (the ViT on its own): {n} devices per replica, numbered "
        f"0..{n - 1} inside the pod."
    )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"{spec.name}-npu", "labels": dict(spec.labels)},
        "spec": {"spec": {"devices": {"requests": [{"name": "npu", "exactly": Note(request, why)}]}}},
    }


def create_secret(spec: Spec) -> str:
    """The command that creates the API key's Secret (the manifests only name it)."""
    ns = f" -n {spec.opts.namespace}" if spec.opts.namespace else ""
    return f"kubectl create secret generic {spec.secret} --from-file=api-key=KEYFILE{ns}"


def _env(spec: Spec) -> list:
    env: list = [{"name": k, "value": v} for k, v in spec.pod.env.items()]
    env.append(
        Note(
            {"name": "VLLM_CACHE_ROOT", "value": CACHE_ROOT},
            "vLLM's cache (and vllm-rbln's compiled_models) on the cache volume, not the read-only artifact.",
        )
    )
    window = spec.budget["window_s"]
    env.append(
        Note(
            {"name": ENGINE_READY_ENV, "value": str(window)},
            f"vLLM's timeout for its engine's ready message, set to the startup probe's whole window ({window} s) "
            "so that the probe, sized from the load below, is what decides. vLLM 0.22 with one API server (this "
            "line) does not bound the model load with it (it waits for the load without a deadline and times only "
            "the handshake after it); a vLLM that bounds its start with it (llm-d's NPU overlay sets 9600) then "
            "never gives up before the probe.",
        )
    )
    if not spec.opts.no_auth:
        env.append(
            Note(
                api_key_env(spec.secret),
                f"vLLM requires this key on {KEY_GUARDS}. It comes from the Secret {spec.secret} (key api-key), which "
                f"you create; no key is ever written here: {create_secret(spec)}",
            )
        )
    return env


def _probe(failure: int, period: int, timeout: int, delay: int = 0) -> dict[str, Any]:
    probe: dict[str, Any] = {"httpGet": {"path": HEALTH, "port": "http"}}
    if delay:
        probe["initialDelaySeconds"] = delay
    return {**probe, "periodSeconds": period, "timeoutSeconds": timeout, "failureThreshold": failure}


def _resources(spec: Spec) -> Any:
    r = spec.resources
    requests: dict[str, Any] = {"cpu": Note(r["cpu"], r["why_cpu"]), "memory": Note(r["memory"], r["why_memory"])}
    limits: dict[str, Any] = {"memory": r["memory"]}
    out: dict[str, Any] = {"requests": requests, "limits": limits}
    n = spec.pod.devices
    if spec.opts.npu == "device-plugin":
        why = (
            f"{n} NPU(s) from Rebellions' device plugin, as the resource {DEVICE_RESOURCE} (extended resources need "
            f"the same request and limit). {DEVICE_RESOURCE_NOTE}"
        )
        requests[DEVICE_RESOURCE] = Note(n, why)
        limits[DEVICE_RESOURCE] = n
    else:
        out["claims"] = [Note({"name": "npu"}, "The NPU(s) of this replica's DRA claim (resourceClaims below).")]
    return out


def _container(spec: Spec) -> dict[str, Any]:
    b = spec.budget
    return {
        "name": "vllm",
        "image": spec.image,
        "command": Note(
            spec.pod.argv,
            "Exactly the command `qvl serve --dry-run` prints for this artifact (one builder), with the artifact at "
            "its mount path and the NPU ids as the pod sees them.",
        ),
        "env": _env(spec),
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "resources": _resources(spec),
        "startupProbe": Note(
            _probe(b["failure_threshold"], PROBE_PERIOD_S, 5, PROBE_DELAY_S),
            f"{PROBE_DELAY_S} + {PROBE_PERIOD_S} x {b['failure_threshold']} s to load before liveness counts. "
            + b["why"],
        ),
        "readinessProbe": Note(_probe(3, 5, 2), f"Traffic only once {HEALTH} answers (no API key needed there)."),
        "livenessProbe": Note(
            _probe(3, 10, 5), f"A hung engine stops answering {HEALTH}: restart it after 30 s (after the start)."
        ),
        "volumeMounts": [
            spec.mount,
            {"name": "shm", "mountPath": "/dev/shm"},
            {"name": "cache", "mountPath": CACHE_ROOT.rsplit("/", 1)[0]},
        ],
    }


def _volumes(spec: Spec) -> list:
    return [
        spec.volume,
        Note(
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{SHM_GIB}Gi"}},
            "vLLM's processes hand decoded images and frames over in shared memory; a container's default /dev/shm "
            f"is 64 MiB. A stated size ({SHM_GIB} GiB), counted in the memory request.",
        ),
        Note(
            {"name": "cache", "emptyDir": {"sizeLimit": f"{CACHE_GIB}Gi"}},
            f"The compile cache (VLLM_CACHE_ROOT): per pod, a restart starts clean; a stated size ({CACHE_GIB} GiB).",
        ),
    ]


def deployment(spec: Spec) -> dict[str, Any]:
    pod: dict[str, Any] = {}
    if spec.init:
        pod["initContainers"] = spec.init
    pod["containers"] = [_container(spec)]
    if spec.opts.npu == "dra":
        pod["resourceClaims"] = [{"name": "npu", "resourceClaimTemplateName": f"{spec.name}-npu"}]
    pod["volumes"] = _volumes(spec)
    b = spec.budget
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": spec.name, "labels": dict(spec.labels)},
        "spec": {
            "replicas": Note(spec.opts.replicas, "Identical single-artifact replicas; the Service spreads requests."),
            "strategy": Note(
                {"type": "Recreate"},
                "A rolling update starts the new pod while the old one still holds its NPU claim; with no spare NPU "
                "the new pod never schedules and the rollout stalls. Recreate frees the NPUs first.",
            ),
            "progressDeadlineSeconds": Note(
                b["progress_deadline_s"],
                f"The startup budget plus {PULL_S} s for pulling the serving image (a stated figure); at the 600 s "
                "default a replica still loading inside its budget would mark the rollout failed.",
            ),
            "selector": {"matchLabels": dict(spec.selector)},
            "template": {"metadata": {"labels": dict(spec.labels)}, "spec": pod},
        },
    }


def service(spec: Spec) -> dict[str, Any]:
    kind = spec.opts.service_type
    why = (
        "ClusterIP: reachable inside the cluster only (a gateway, llm-d's router or a port-forward in front)."
        if kind == "ClusterIP"
        else f"{kind}, as asked (--service-type): reachable from outside the cluster; the API key guards {KEY_GUARDS}."
    )
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": spec.name, "labels": dict(spec.labels)},
        "spec": {
            "type": Note(kind, why),
            "selector": dict(spec.selector),
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
