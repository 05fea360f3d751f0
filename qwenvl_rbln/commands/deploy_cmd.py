"""`qvl deploy`: the Kubernetes (or llm-d) manifests for a compiled artifact, as a kustomize folder.

The container's command and environment come from the function `qvl serve --dry-run` uses, after serve's own
preflight; the rest (the NPU claim, probes, resources, volumes, the API key Secret) is derived from the artifact
(``qwenvl_rbln/deploy/``). ``--dry-run`` prints the files; ``--json`` lists them (with their text on a dry run).
"""

from __future__ import annotations

from pathlib import Path

import typer

from qwenvl_rbln.commands.common import JsonOpt
from qwenvl_rbln.commands.serve_cmd import DirArg, PassThrough, VllmRblnOpt, _split, unshown


def register(app: typer.Typer) -> None:
    @app.command("deploy")
    def deploy(
        directory: Path = DirArg,
        vllm_args: list[str] = PassThrough,
        target: str = typer.Option(
            "kubernetes", "--target", help="kubernetes, or llm-d (its labels and router values)."
        ),
        out: Path = typer.Option(None, "--out", "-o", help="The kustomize folder to write (`kubectl apply -k OUT`)."),
        artifact: str = typer.Option(
            None,
            "--artifact",
            help="Where the pods find the artifact: pvc:CLAIM\\[/SUBPATH], hostpath:/PATH (on each node) or image:REF "
            "(an image holding it at /artifact).",
            show_default=False,
        ),
        image: str = typer.Option(
            None, "--image", help="The vllm-rbln serving image (the Containerfile starts FROM it).", show_default=False
        ),
        plugin: bool = typer.Option(
            True,
            "--plugin/--no-plugin",
            help="Build the image with qvl inside (frame cap, ViT packing, decode batch sort); --no-plugin runs "
            "--image as it is and the manifests say what that costs.",
        ),
        plugin_image: str = typer.Option(
            None, "--plugin-image", help="What the built image is pushed as (default: --image's tag + -qvlVERSION)."
        ),
        replicas: int = typer.Option(1, "--replicas", help="Replicas (one artifact placement each)."),
        npu: str = typer.Option(
            "dra", "--npu", help="dra (a ResourceClaimTemplate) or device-plugin (rebellions.ai/npu)."
        ),
        name: str = typer.Option(None, "--name", help="Object name (default: from the served model name)."),
        namespace: str = typer.Option(
            None, "--namespace", "-n", help="Namespace for every object (default: none set)."
        ),
        service_type: str = typer.Option("ClusterIP", "--service-type", help="ClusterIP, NodePort or LoadBalancer."),
        api_key_secret: str = typer.Option(
            None, "--api-key-secret", help="Secret holding the API key under `api-key` (default: NAME-api-key)."
        ),
        no_auth: bool = typer.Option(False, "--no-auth", help="No API key: anyone who reaches the Service may call."),
        load_check: Path = typer.Option(
            None,
            "--load-check",
            help="`qvl load-check --json` report from the NPU host: size the startup probe from it.",
        ),
        preset: str = typer.Option(None, "--preset", "-p", help="Preset for the default DIR and runtime choices."),
        served_model_name: str = typer.Option(None, "--served-model-name", help="Model name clients send."),
        vit_packing: bool = typer.Option(
            None, "--vit-packing/--no-vit-packing", help="As for `qvl serve`.", show_default=False
        ),
        vllm_rbln: str = VllmRblnOpt,
        force: bool = typer.Option(False, "--force", help="Replace an OUT folder that qvl deploy wrote."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the files; write nothing."),
        as_json: bool = JsonOpt,
    ) -> None:
        """Write the Kubernetes / llm-d manifests for a compiled artifact (a kustomize folder), derived and checked."""
        from qwenvl_rbln.deploy.build import build, report
        from qwenvl_rbln.deploy.options import DeployOptions
        from qwenvl_rbln.deploy.write import check_out, working_dir, write_folder
        from qwenvl_rbln.views import render
        from qwenvl_rbln.views.deploy import human

        working_dir()  # a deleted working directory is one line, before any relative path is read
        directory, extra = _split(directory, vllm_args)
        opts = DeployOptions(
            directory=directory, target=target, out=out, replicas=replicas, npu=npu, artifact=artifact, image=image,
            plugin=plugin, plugin_image=plugin_image, name=name, namespace=namespace, service_type=service_type,
            api_key_secret=api_key_secret, no_auth=no_auth, load_check=load_check, preset=preset,
            served_model_name=served_model_name, vit_packing=vit_packing, extra=extra, force=force, dry_run=dry_run,
            vllm_rbln=vllm_rbln,
        )  # fmt: skip
        if out is not None and not dry_run:
            check_out(out, force)  # an occupied OUT is refused before the artifact is read
        result = build(opts)
        pod = result["spec"].pod
        for line in pod.warnings if as_json else unshown(pod.warnings, pod.checks):  # `# warn` lines say the rest
            render.warn(line)
        written = None
        if not dry_run:
            written = str(write_folder(out, result["files"], force))
        render.emit(report(result, written, dry_run=dry_run), as_json=as_json, human=human)
