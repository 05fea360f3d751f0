"""``qvl deploy`` as data: check the artifact as ``qvl serve`` does, derive every number, and return the files of
the kustomize folder (path -> text) with what the command reports. Writing them is ``deploy.write``'s job.
"""

from __future__ import annotations

from typing import Any

from qwenvl_rbln import __version__
from qwenvl_rbln.artifacts.manifest import graph_hash, tree_bytes
from qwenvl_rbln.deploy import llmd, manifests, sizing, source
from qwenvl_rbln.deploy.options import K8S_VERSION, DeployOptions, default_name
from qwenvl_rbln.deploy.pod import POD_HOST, pod_launch
from qwenvl_rbln.deploy.wheel import build_wheel, wheel_name
from qwenvl_rbln.deploy.yamltext import Note, dump
from qwenvl_rbln.serving.options import ServeOptions

MODEL_PATH = f"{source.MODEL_ROOT}/artifact"  # vllm serve MODEL_PATH in the pod


def _served(opts: DeployOptions) -> ServeOptions:
    return ServeOptions(
        directory=opts.directory,
        preset=opts.preset,
        host=POD_HOST,
        served_model_name=opts.served_model_name,
        vit_packing=opts.vit_packing,
        extra=list(opts.extra),
        no_auth=True,  # who may call is the Secret's job in a cluster (manifests._env), not serve's
        vllm_rbln=opts.vllm_rbln,
        engine_here=False,  # the pod's image decides, never a vllm-rbln installed where deploy runs
    )


def spec_for(opts: DeployOptions) -> manifests.Spec:
    """Every decision, in the order a refusal should come: options, then the artifact (serve's preflight)."""
    src = source.parse_artifact(opts.artifact)
    base = source.check_image(opts.image, "--image")
    image = base
    if opts.plugin:
        image = source.check_image(opts.plugin_image, "--plugin-image") if opts.plugin_image else None
        image = image or source.plugin_image(base, __version__)
    pod = pod_launch(_served(opts), MODEL_PATH, plugin=opts.plugin)
    served = pod.argv[pod.argv.index("--served-model-name") + 1]
    name = opts.name or default_name(served)
    size = tree_bytes(pod.art.root)
    graphs = graph_hash(pod.art.root, pod.art.manifest)  # once: the load time and the timings are keyed by it
    measured, measured_from = sizing.measured_load_s(opts.load_check, pod.art.root, graphs)
    volume, mount, init = source.artifact_volume(src, size)
    selector = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "model-server"}
    labels = {**selector, "app.kubernetes.io/managed-by": "qvl", "app.kubernetes.io/version": __version__}
    if opts.target == "llm-d":
        labels.update(llmd.labels(name))
    return manifests.Spec(
        opts=opts,
        name=name,
        pod=pod,
        image=image,
        secret=opts.api_key_secret or f"{name}-api-key",
        labels=labels,
        selector=selector,
        volume=volume,
        mount=mount,
        init=init,
        budget=sizing.load_budget(measured, size, measured_from),
        resources=sizing.host_resources(pod.art.cfg, size),
        npu=pod.art.target.get("npu"),
        graph_hash=graphs,
    )


def _max_model_len(argv: list[str]) -> int:
    return int(argv[argv.index("--max-model-len") + 1])


def containerfile(spec: manifests.Spec) -> str:
    """Build the serving image from --image plus this qvl, installed from the wheel beside the Containerfile (the
    build context), never from a package index."""
    opts = spec.opts
    whl = wheel_name()
    return "\n".join(
        [
            f"# Written by qvl deploy {__version__}. The serving image for {spec.name}: the vllm-rbln image you gave",
            "# (--image) with this qvl version inside, because the video frame cap, ViT packing and the decode sort",
            "# are qvl's vLLM plugin and run in vLLM's own processes. Build it in this folder (the build context holds",
            "# the wheel) and push it where the cluster pulls from:",
            f"#   podman build -t {spec.image} -f Containerfile . && podman push {spec.image}",
            "# (docker build / docker push work the same way). deployment.yaml runs that image.",
            f"FROM {opts.image}",
            f"# {whl}: the qvl that wrote this folder, as a wheel (qvl deploy writes it beside this file).",
            f"COPY {whl} /tmp/{whl}",
            "# --no-index: nothing is fetched; --no-deps: vllm-rbln, optimum-rbln, torch and transformers stay exactly",
            "# as the base image pins them.",
            f"RUN pip install --no-cache-dir --no-deps --no-index /tmp/{whl} && rm /tmp/{whl}",
            "# Fails the build, not the pod, when the plugin or the key guard (--middleware) cannot load in this",
            "# image's Python.",
            'RUN python -c "import qwenvl_rbln.vllm_plugin, qwenvl_rbln.serving.key_guard"',
            "",
        ]
    )


def _kustomization(spec: manifests.Spec, resources: list[str]) -> dict[str, Any]:
    data: dict[str, Any] = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"}
    if spec.opts.namespace:
        data["namespace"] = Note(spec.opts.namespace, "Every object goes into this namespace (--namespace).")
    data["resources"] = resources
    return data


def _header(spec: manifests.Spec) -> str:
    steps = [f"Written by qvl deploy {__version__} for {spec.pod.art.root} ({spec.opts.target}, Kubernetes "
             f"{K8S_VERSION}+: DRA resource.k8s.io/v1 is GA there). Regenerate it rather than editing it: qvl deploy "
             "--force replaces this folder."]  # fmt: skip
    n = 1
    if spec.opts.plugin:
        steps.append(
            f"{n}. Build and push the serving image {spec.image} from this folder (see Containerfile; the folder "
            f"holds the qvl wheel it installs, {wheel_name()})."
        )
        n += 1
    if not spec.opts.no_auth:
        steps.append(f"{n}. {manifests.create_secret(spec)}")
        n += 1
    else:
        steps.append(f"{n}. --no-auth: no API key; every client that reaches the Service may call every route.")
        n += 1
    if spec.opts.target == "llm-d":
        steps.append(f"{n}. helm install the llm-d router with the guide's values and -f llm-d/router.values.yaml.")
        n += 1
    steps.append(f"{n}. kubectl apply -k THIS_FOLDER")
    return "\n".join(steps)


def build(opts: DeployOptions) -> dict[str, Any]:
    """The files (relative path -> text, or bytes for the wheel) and the report: what was derived, the warnings and
    the next steps."""
    spec = spec_for(opts)
    objects: dict[str, dict[str, Any]] = {"deployment.yaml": manifests.deployment(spec)}
    objects["service.yaml"] = manifests.service(spec)
    if opts.npu == "dra":
        objects["resourceclaimtemplate.yaml"] = manifests.claim_template(spec)
    files: dict[str, str | bytes] = {
        path: dump(obj, f"qvl deploy: {obj['kind']} {spec.name}.") for path, obj in objects.items()
    }
    header = _header(spec)
    if not opts.plugin:
        header += "\n--no-plugin: the image has no qvl, so the plugin's variables are left out. That costs: "
        header += "; ".join(spec.pod.costs) + "."
    files["kustomization.yaml"] = dump(_kustomization(spec, list(objects)), header)
    extra: dict[str, dict[str, Any]] = {}
    if opts.target == "llm-d":
        art = spec.pod.art
        prefill = sizing.prefill_throughput(art.model_config, art.cfg, spec.npu, spec.graph_hash)
        select = {k: v for k, v in spec.labels.items() if k.startswith("llm-d.ai/")}
        cited = "Follows llm-d/llm-d " + ", ".join(llmd.GUIDE_FILES) + "."
        extra["llm-d/router.values.yaml"] = llmd.router_values(select, _max_model_len(spec.pod.argv), prefill)
        files["llm-d/router.values.yaml"] = dump(extra["llm-d/router.values.yaml"], cited)
        extra["llm-d/inferencepool.yaml"] = llmd.inference_pool(spec.name, select)
        files["llm-d/inferencepool.yaml"] = dump(
            extra["llm-d/inferencepool.yaml"],
            "Not in kustomization.yaml: the router chart creates this pool from router.values.yaml. Apply it only "
            "with a gateway set up without that chart. " + cited,
        )
    pending: list[str] = []  # files written, not built, on --dry-run (the wheel: a zip of the whole package)
    if opts.plugin:
        files["Containerfile"] = containerfile(spec)
        if opts.dry_run:
            pending.append(wheel_name())
        else:
            files[wheel_name()] = build_wheel()
    return {"spec": spec, "objects": objects, "extra": extra, "files": dict(sorted(files.items())), "pending": pending}


def report(result: dict[str, Any], out: str | None, *, dry_run: bool) -> dict[str, Any]:
    """What the command prints (``--json``: this document)."""
    spec: manifests.Spec = result["spec"]
    files = [{"path": p, "bytes": len(t if isinstance(t, bytes) else t.encode())} for p, t in result["files"].items()]
    if dry_run:
        for row in files:
            content = result["files"][row["path"]]
            row["text"] = content if isinstance(content, str) else None  # the wheel: binary, listed by size
        pending = [{"path": p, "bytes": None, "text": None} for p in result.get("pending", [])]  # built when written
        files = sorted(files + pending, key=lambda row: row["path"])
    notes = []
    if spec.opts.plugin:
        notes.append(f"build and push {spec.image} from {out or 'OUT'}/Containerfile before applying: "
                     "the frame cap, ViT packing and the decode sort run only with qvl inside the image")  # fmt: skip
    else:
        notes += [f"--no-plugin: {c}" for c in spec.pod.costs]
    return {
        "out": out,
        "dry_run": dry_run,
        "target": spec.opts.target,
        "kubernetes": K8S_VERSION,
        "name": spec.name,
        "image": spec.image,
        "npu": {"mode": spec.opts.npu, "devices_per_replica": spec.pod.devices, "family": spec.npu_family},
        "startup_budget_s": spec.budget["budget_s"],
        "load_measured": spec.budget["measured_s"] is not None,
        "files": files,
        "checks": spec.pod.checks,
        "warnings": spec.pod.warnings,
        "notes": notes,
        "next": _header(spec).split("\n")[1:],
    }
