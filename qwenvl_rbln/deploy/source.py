"""Where the pod finds the artifact (``--artifact pvc:CLAIM[/SUBPATH] | hostpath:PATH | image:REF``) and which
image it runs: the volume, the mount and (for an artifact image) the init container that copies it in.

The artifact is read-only in the pod: vLLM loads the graphs and never writes beside them (its compile cache has its
own volume), so a PVC or host path shared by every replica is mounted ``readOnly``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from qwenvl_rbln.deploy.options import check_subdomain
from qwenvl_rbln.deploy.yamltext import Note
from qwenvl_rbln.errors import InputError

MODEL_ROOT = "/models"  # the artifact appears in the pod at /models/artifact
ARTIFACT_IN_IMAGE = "/artifact"  # where an --artifact image:REF holds the artifact
ARTIFACT_FIX = "pass --artifact pvc:CLAIM[/SUBPATH], hostpath:/ABS/PATH or image:REF"
_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*")


@dataclass(frozen=True)
class ArtifactSource:
    kind: str  # pvc | hostpath | image
    ref: str  # claim name, node path or image reference
    subpath: str = ""  # pvc only

    def describe(self) -> str:
        return f"{self.kind}:{self.ref}" + (f"/{self.subpath}" if self.subpath else "")


def parse_artifact(value: str | None) -> ArtifactSource:
    """``--artifact``: one of the three forms, each checked so kubectl never sees a malformed name."""
    if not value or ":" not in value:
        given = f"--artifact {value!r}" if value else "no --artifact"  # never Python's None in a message
        raise InputError(f"{given}: say where the pods find the compiled artifact", ARTIFACT_FIX)
    kind, _, rest = value.partition(":")
    if kind == "pvc":
        claim, _, sub = rest.partition("/")
        sub = sub.strip("/")
        check_subdomain(
            f"--artifact {value}: claim",
            claim,
            "a PersistentVolumeClaim",
            "pass the claim's name as `kubectl get pvc` lists it, e.g. --artifact pvc:qwen3-vl/rebel100-1npu",
        )
        if ".." in sub.split("/"):
            raise InputError(f"--artifact {value}: the sub-path may not contain '..'", "name a folder inside the claim")
        return ArtifactSource("pvc", claim, sub)
    if kind == "hostpath":
        if not rest.startswith("/") or ".." in rest.split("/"):
            raise InputError(
                f"--artifact {value}: a host path must be absolute and without '..'",
                "pass the artifact's folder as the node sees it, e.g. --artifact hostpath:/data/qvl-out/rebel100-1npu",
            )
        return ArtifactSource("hostpath", rest.rstrip("/") or "/")
    if kind == "image":
        if not _REF.fullmatch(rest):
            raise InputError(f"--artifact {value}: {rest!r} is not an image reference", "e.g. image:REGISTRY/ART:TAG")
        return ArtifactSource("image", rest)
    raise InputError(f"--artifact {value}: unknown kind {kind!r}", ARTIFACT_FIX)


def check_image(value: str | None, flag: str) -> str:
    if not value or not _REF.fullmatch(value):
        raise InputError(
            f"{flag} {value!r}: not an image reference" if value is not None else f"no {flag}: the image is required",
            f"pass {flag} REGISTRY/REPO:TAG (the vllm-rbln serving image your cluster pulls)",
        )
    return value


def plugin_image(base: str, version: str) -> str:
    """The image the Containerfile builds, named after the one it starts from: ``repo:tag`` becomes
    ``repo:tag-qvl<version>`` (a digest or no tag: ``repo:qvl<version>``), so it lands in the same repository."""
    if "@" in base:
        return f"{base.split('@', 1)[0]}:qvl{version}"
    repo, sep, tag = base.rpartition(":")
    if sep and "/" not in tag:
        return f"{repo}:{tag}-qvl{version}"
    return f"{base}:qvl{version}"


def artifact_volume(src: ArtifactSource, size_bytes: int) -> tuple[Any, dict, list]:
    """(volume, mount, init containers): the artifact at ``/models/artifact`` in the serving container."""
    mount_path = f"{MODEL_ROOT}/artifact"
    mount: dict[str, Any] = {"name": "artifact", "mountPath": mount_path, "readOnly": True}
    if src.kind == "pvc":
        if src.subpath:
            mount["subPath"] = src.subpath
        volume = Note(
            {"name": "artifact", "persistentVolumeClaim": {"claimName": src.ref, "readOnly": True}},
            f"The compiled artifact on PVC {src.ref}"
            + (f" (folder {src.subpath})" if src.subpath else "")
            + ": it must hold the same files qvl checked here (qvl-manifest.json lists their hashes). Every replica "
            "mounts it read-only, so a ReadOnlyMany (or ReadWriteMany) claim serves them all.",
        )
        return volume, mount, []
    if src.kind == "hostpath":
        volume = Note(
            {"name": "artifact", "hostPath": {"path": src.ref, "type": "Directory"}},
            f"The compiled artifact at {src.ref} on every node that may run a replica (copy it there first; "
            "type Directory makes a node without it fail the pod instead of serving an empty folder).",
        )
        return volume, mount, []
    gib = max(1, -(-size_bytes // 2**30) + 1)
    volume = Note(
        {"name": "artifact", "emptyDir": {"sizeLimit": f"{gib}Gi"}},
        f"The artifact image {src.ref} is copied here by the init container at each start: the artifact is "
        f"{size_bytes / 2**30:.2f} GiB, plus 1 GiB of slack.",
    )
    init = Note(
        {
            "name": "copy-artifact",
            "image": src.ref,
            "command": ["cp", "-a", f"{ARTIFACT_IN_IMAGE}/.", "/target/"],
            "volumeMounts": [{"name": "artifact", "mountPath": "/target"}],
        },
        f"The image must hold the artifact folder at {ARTIFACT_IN_IMAGE} and a `cp` (e.g. FROM busybox, "
        f"COPY qvl-out/NAME {ARTIFACT_IN_IMAGE}).",
    )
    return volume, mount, [init]  # the init container writes it; the server only reads it
