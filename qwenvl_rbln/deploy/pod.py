"""The serving container's command and environment: exactly what ``qvl serve --dry-run`` builds for the artifact
(``serving.command.checked_launch``, the same preflight and the same ``vllm_launch``), then moved into a pod.

Moving it changes three things and nothing else: the NPU ids become the pod's (its claimed NPUs are numbered from 0,
whatever their ids on the node), the artifact path becomes the mount path, and the API key comes from a Secret. An
image without qvl (``--no-plugin``) also drops the plugin's variables, and the notes say what that costs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from qwenvl_rbln.deploy.options import PORT
from qwenvl_rbln.serving.decode_sort import SORT_ENV
from qwenvl_rbln.serving.options import (
    API_KEY_ENV,
    FRAME_CAP_ENV,
    KEY_GUARD,
    MAX_FRAME_PIXELS_ENV,
    PACKING_ENV,
    PLUGIN_NAME,
    Artifact,
    Launch,
    ServeOptions,
)
from qwenvl_rbln.serving.preflight import warn
from qwenvl_rbln.serving.resume_features import RESUME_ENV

PLUGIN_ENVS = (PACKING_ENV, FRAME_CAP_ENV, MAX_FRAME_PIXELS_ENV, SORT_ENV, RESUME_ENV)
POD_HOST = "0.0.0.0"  # the pod's network namespace: the Service and the probes reach it on the pod IP


@dataclass
class PodLaunch:
    art: Artifact
    argv: list[str]
    env: dict[str, str]
    checks: list[dict[str, Any]]
    devices: int  # NPUs one replica claims
    warnings: list[str] = field(default_factory=list)
    costs: list[str] = field(default_factory=list)  # what --no-plugin gives up (empty with the plugin)


def pod_numbering(where: dict[str, Any]) -> dict[str, Any]:
    """The placement as the pod sees it: the claimed NPUs are 0..n-1 in the order of the physical ids, so the
    overrides (positions in that list) stay as they are and only the ids change."""
    visible = list(where["visible"])
    local = {phys: i for i, phys in enumerate(visible)}

    def renumber(value: Any) -> Any:
        return [local[i] for i in value] if isinstance(value, list) else local.get(value, value)

    return {
        **where,
        "device": renumber(where["device"]),
        "visual_device": renumber(where["visual_device"]),
        "visible": list(range(len(visible))),
        "source": f"{where['source']}, numbered as the pod sees its {len(visible)} claimed NPU(s)",
    }


# Pass-through flags a pod cannot take, with deploy's own fix (serve's would name serve's options): checked before
# serve's pass-through check, which refuses the same flags with serve's wording.
DEPLOY_OWNED = {
    "--api-key": "the pods read the key from a Secret: create it and pass --api-key-secret NAME (key api-key; "
    "default NAME-api-key), so no key is ever written into a manifest",
    "--host": "drop it: the pod listens on 0.0.0.0, where its Service and probes reach it (who may call is the "
    "Service's --service-type and the API key)",
    "--port": f"drop it: the container listens on {PORT}, the port the Service, the probes and llm-d's InferencePool "
    "target; clients use the Service's address",
    "--served-model-name": "use qvl deploy --served-model-name instead",
    "--rbln-optimum-overrides": "drop it: the placement comes from the artifact, renumbered as the pod sees its "
    "claimed NPUs",
    "--additional-config": "drop it: the placement comes from the artifact, renumbered as the pod sees its claimed "
    "NPUs (vllm-rbln 0.11's rbln_config)",
    "--model": "pass the artifact as qvl deploy DIR (the pod mounts it with --artifact)",
}


def check_deploy_flags(extra: list[str]) -> None:
    """Refuse pass-through flags that qvl deploy sets for the pod, with deploy's fix; nothing is written."""
    from qwenvl_rbln.serving.flags import refuse_owned

    refuse_owned(extra, DEPLOY_OWNED, by="qvl deploy", fix="{}", outcome="nothing was written")


def pod_launch(opts: ServeOptions, model_path: str, *, plugin: bool) -> PodLaunch:
    """``qvl serve --dry-run``'s launch for ``opts`` (host 0.0.0.0), renumbered and moved into the pod."""
    from qwenvl_rbln.serving.command import checked_launch

    check_deploy_flags(list(opts.extra))
    art, launch, warnings = checked_launch(opts, {}, command="deploy", remap=pod_numbering)
    argv = [model_path if i == 2 else a for i, a in enumerate(launch.argv)]  # vllm serve DIR ...
    env = {k: v for k, v in launch.env.items() if v is not None}
    costs: dict[str, str] = {}
    if not plugin:  # no qvl in the image: its middleware cannot be imported there either
        costs = _plugin_costs(launch)
        argv = _without_key_guard(argv)
        env = {k: v for k, v in env.items() if k not in PLUGIN_ENVS}
        if env.get("VLLM_PLUGINS"):
            env["VLLM_PLUGINS"] = ",".join(p for p in env["VLLM_PLUGINS"].split(",") if p != PLUGIN_NAME)
    devices = len((launch.env.get(launch.device_env) or "0").split(","))
    checks = launch.checks if plugin else _without_plugin(launch.checks, costs)
    return PodLaunch(art, argv, env, checks, devices, warnings, list(costs.values()))


# serve's check -> the cost (``_plugin_costs``) of its plugin part
PLUGIN_CHECKS = {
    "video frame cap": "frame cap",
    "video cap": "frame cap",
    "key guard": "key guard",
    "vit packing": "packing",
    "decode sort": "sort",
    "preemption": "resume",
}


def _without_key_guard(argv: list[str]) -> list[str]:
    """The serve line without qvl's ``--middleware`` (an image without qvl cannot import it)."""
    i = next(i for i, a in enumerate(argv) if a == KEY_GUARD and argv[i - 1] == "--middleware")
    return argv[: i - 1] + argv[i + 1 :]


def _without_plugin(checks: list[dict[str, Any]], costs: dict[str, str]) -> list[dict[str, Any]]:
    """Serve's checks with the plugin's own ones turned into what --no-plugin costs (a warning, never "ok"): one
    warning per cost, however many of serve's checks it replaces (the frame cap and the processor's video cap are
    one cause)."""
    out: list[dict[str, Any]] = []
    said: set[str] = set()
    for check in checks:
        cost = PLUGIN_CHECKS.get(check["check"])
        if cost is None:
            out.append(check)
        elif cost not in said:
            said.add(cost)
            warn(out, check["check"], f"off (--no-plugin: the image has no qvl): {costs[cost]}")
    return out


def _plugin_costs(launch: Launch) -> dict[str, str]:
    """What serving without qvl in the image gives up, for this artifact, by cost (``PLUGIN_CHECKS``' values)."""
    costs = {
        "frame cap": f"no video frame cap ({FRAME_CAP_ENV}): a long or large video can exceed the largest ViT bucket "
        "and fail the request (or the engine) instead of being capped per frame",
        "key guard": f"no key guard ({KEY_GUARD}): vLLM alone requires the API key only under /v1, /v2 and /inference, "
        "so POST /invocations (a full chat completion), /tokenize and /detokenize answer anyone who reaches the pod; "
        "keep the plugin, or let only the public routes through at your gateway",
        "packing": f"no ViT packing ({PACKING_ENV}): every image and video runs in its own ViT call, so a multimodal "
        "batch costs more NPU time",
    }
    if SORT_ENV in launch.env:
        costs["sort"] = (
            f"no decode batch sort ({SORT_ENV}): the decoder was compiled with _requires_batch_sort and vllm-rbln's "
            "optimum runner does not sort, so the first two requests of different lengths decoding together end the "
            "engine (the replica restarts); keep the plugin, or recompile with batch_size 1"
        )
    if RESUME_ENV in launch.env:
        costs["resume"] = (
            f"no resumed images ({RESUME_ENV}): the KV pool is short of batch_size x max_seq_len, so vLLM can preempt "
            "a request, and vllm-rbln recomputes a preempted image or video request without its images: the engine "
            "ends (the replica restarts); keep the plugin, or recompile with a full KV pool"
        )
    return costs


def api_key_env(secret: str) -> dict[str, Any]:
    return {"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": secret, "key": "api-key"}}}
