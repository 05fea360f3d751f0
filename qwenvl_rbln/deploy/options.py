"""What ``qvl deploy`` takes: the options as one checked record, and the names the manifests share."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from qwenvl_rbln.errors import InputError

TARGETS = ("kubernetes", "llm-d")
NPU_MODES = ("dra", "device-plugin")
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
K8S_VERSION = "1.34"  # the oldest Kubernetes where DRA's resource.k8s.io/v1 is GA: what the manifests target
DEVICE_CLASS = "npu.rebellions.ai"  # Rebellions' DRA DeviceClass (one for every product)
DEVICE_RESOURCE = "rebellions.ai/npu"  # the device plugin's generic resource name (RBLN-SW/k8s-device-plugin)
LEGACY_RESOURCE = "rebellions.ai/REBEL"  # what a plugin without --use-generic-resource-name exposes for Rebel100
DEVICE_RESOURCE_NOTE = (
    f"The plugin exposes {DEVICE_RESOURCE} when it runs with --use-generic-resource-name (its Helm chart sets "
    f"useGenericResourceName: true; the NPU operator ships it so from device plugin v0.4.2). A plugin without that "
    f"flag (its binary default in older releases, or an older NPU operator such as one shipping v0.3.x) exposes the "
    f"per-product {LEGACY_RESOURCE} instead, and a pod asking for {DEVICE_RESOURCE} never schedules: "
    f"`kubectl describe node` lists which one your nodes have; if it is {LEGACY_RESOURCE}, write that name here "
    "(request and limit) or turn the flag on."
)
PORT = 8000  # vLLM's default, and the port llm-d's InferencePool targets
_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # a DNS-1035 label: what a Service name must be
MAX_NAME = 40  # room for the suffixes (-npu, -api-key) and the ReplicaSet and pod hashes under 63
# Kubernetes' own rules (apimachinery's validation): a namespace is a DNS-1123 label (63 characters, may start with a
# digit); a PersistentVolumeClaim or a Secret name is a DNS-1123 subdomain (253 characters, dots between labels).
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
MAX_LABEL = 63
MAX_SUBDOMAIN = 253

MAX_REPLICAS = 2**31 - 1  # Kubernetes' int32 spec.replicas


@dataclass
class DeployOptions:
    directory: Path | None = None
    target: str = "kubernetes"
    out: Path | None = None
    replicas: int = 1
    npu: str = "dra"
    artifact: str | None = None  # pvc:CLAIM[/SUBPATH] | hostpath:PATH | image:REF
    image: str | None = None  # the vllm-rbln serving image the Containerfile starts from
    plugin: bool = True  # build an image with qvl in it (the frame cap, ViT packing, the decode batch sort)
    plugin_image: str | None = None  # what that image is pushed as (default: derived from image)
    name: str | None = None
    namespace: str | None = None
    service_type: str = "ClusterIP"
    api_key_secret: str | None = None  # default NAME-api-key
    no_auth: bool = False
    load_check: Path | None = None  # `qvl load-check --json` report with a measured load time
    preset: str | None = None
    served_model_name: str | None = None
    vit_packing: bool | None = None
    extra: list[str] = field(default_factory=list)
    force: bool = False
    dry_run: bool = False
    vllm_rbln: str | None = None  # the image's vllm-rbln: its generation's serve line (default serving.engine.DEFAULT)

    def __post_init__(self) -> None:
        _choice("--target", self.target, TARGETS)
        _choice("--npu", self.npu, NPU_MODES)
        _choice("--service-type", self.service_type, SERVICE_TYPES)
        if self.replicas < 1:
            raise InputError(f"--replicas {self.replicas}: at least one replica", "pass --replicas 1 or more")
        if self.replicas > MAX_REPLICAS:  # Kubernetes' spec.replicas is an int32: kubectl would refuse the file
            raise InputError(
                f"--replicas {self.replicas} is more than a Deployment holds (spec.replicas is an int32, at most "
                f"{MAX_REPLICAS})",
                "pass the replicas the rate needs (`qvl tune --slo ... --rate R` prints them)",
            )
        if self.out is None and not self.dry_run:
            raise InputError("no output folder", "pass -o OUT (the kustomize folder to write), or --dry-run")
        if self.name is not None:
            check_name("--name", self.name)
        if self.namespace is not None:
            check_namespace(self.namespace)
        if self.api_key_secret is not None:
            if self.no_auth:
                raise InputError(
                    f"conflicting flags: --api-key-secret {self.api_key_secret} names the Secret that holds the API "
                    "key, and --no-auth serves without one",
                    "drop --no-auth (the pods then require the key from that Secret), or drop --api-key-secret",
                )
            check_subdomain(
                "--api-key-secret",
                self.api_key_secret,
                "a Secret",
                "pass the Secret's name as `kubectl get secrets` lists it",
            )


def _choice(flag: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise InputError(f"{flag} {value!r} is not one of {', '.join(allowed)}", f"pass {flag} {allowed[0]}")


def check_name(flag: str, value: str) -> str:
    if not _NAME.fullmatch(value) or len(value) > MAX_NAME:
        raise InputError(
            f"{flag} {value!r}: not a Kubernetes name (lowercase letters, digits and '-', starting with a letter, "
            f"at most {MAX_NAME} characters here)",
            f"pass e.g. {flag} qwen3-vl-2b",
        )
    return value


def check_namespace(value: str) -> str:
    if not DNS_LABEL.fullmatch(value) or len(value) > MAX_LABEL:
        raise InputError(
            f"--namespace {value!r}: not a Kubernetes namespace name (a DNS-1123 label: lowercase letters, digits "
            f"and '-', starting and ending with a letter or digit, at most {MAX_LABEL} characters)",
            "pass the namespace as `kubectl get namespaces` lists it, e.g. --namespace serving",
        )
    return value


def check_subdomain(flag: str, value: str, what: str, fix: str) -> str:
    """A PersistentVolumeClaim or Secret name: Kubernetes' DNS-1123 subdomain (dots allowed between labels)."""
    if not DNS_SUBDOMAIN.fullmatch(value) or len(value) > MAX_SUBDOMAIN:
        raise InputError(
            f"{flag} {value!r}: not {what} name (a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', "
            f"starting and ending with a letter or digit, at most {MAX_SUBDOMAIN} characters)",
            fix,
        )
    return value


def default_name(served: str) -> str:
    """A Kubernetes name from the served model name: ``Qwen/Qwen3-VL-2B-Instruct`` -> ``qwen3-vl-2b-instruct``."""
    base = re.sub(r"[^a-z0-9]+", "-", served.rsplit("/", 1)[-1].lower()).strip("-")
    base = base[:MAX_NAME].rstrip("-")
    if not base or not base[0].isalpha():
        base = ("qvl-" + base)[:MAX_NAME].rstrip("-")
    return base
