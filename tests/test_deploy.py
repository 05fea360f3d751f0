"""`qvl deploy`: the manifests are derived from the artifact through serve's own functions, renumbered for the pod,
and every emitted object is valid for Kubernetes 1.34 (DRA resource.k8s.io/v1 GA) by Kubernetes' own OpenAPI schemas.

Artifacts are built in the real optimum-rbln 0.12 layout by tests/fakes_rbln.py (as tests/test_serve.py does); nothing
is compiled, no cluster is contacted. ``kubectl kustomize`` runs where kubectl exists.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from qwenvl_rbln import __version__
from qwenvl_rbln.artifacts.manifest import write_manifest
from qwenvl_rbln.deploy.build import build
from qwenvl_rbln.deploy.options import K8S_VERSION, DeployOptions
from qwenvl_rbln.deploy.yamltext import plain
from qwenvl_rbln.errors import InputError
from qwenvl_rbln.planning.plan import build_plan
from qwenvl_rbln.serving.command import serve_command
from qwenvl_rbln.serving.options import ServeOptions
from tests.fakes_rbln import run_main, write_artifact

kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is a dev dependency (make install)")

IMAGE = "registry.internal/vllm-rbln:0.12.0"
MODEL = {"id": "Qwen/Qwen3-VL-2B-Instruct"}


def _artifact(root: Path, preset: str, placement: dict | None = None) -> Path:
    plan = build_plan(preset)
    write_artifact(root, plan)
    write_manifest(root, {"format": 1, "npu": plan.npu, "placement": placement or plan.placement, "model": MODEL})
    return root


@pytest.fixture(scope="module", autouse=True)
def own_qvl_home(tmp_path_factory):
    """An empty QVL_HOME: a load another test's load-check recorded for the same fake graphs (load-times.json) must
    not turn this module's stated startup figure into a measured one."""
    mp = pytest.MonkeyPatch()
    mp.setenv("QVL_HOME", str(tmp_path_factory.mktemp("deploy-home")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def arts(tmp_path_factory):
    base = tmp_path_factory.mktemp("deploy")
    return {
        # compiled for NPU 1 on its host: the pod must call its one claimed NPU 0
        "one": _artifact(base / "one", "rebel100-1npu", {"device": 1, "visual_device": 1}),
        # the ViT on its own NPU (LM 0, ViT 1): two devices per replica
        "two": _artifact(base / "two", "rebel100-2npu-batch4"),
    }


def opts(directory: Path, **kw) -> DeployOptions:
    base = {"directory": directory, "artifact": "pvc:models/qwen3-vl", "image": IMAGE, "dry_run": True}
    return DeployOptions(**{**base, **kw})


@pytest.fixture(scope="module")
def built(arts):
    """The four shapes (target x NPU mode), built once."""
    return {
        ("kubernetes", "dra"): build(opts(arts["one"])),
        ("kubernetes", "device-plugin"): build(
            opts(arts["two"], npu="device-plugin", replicas=3, artifact="image:registry.internal/qwen3-vl-art:1")
        ),
        ("llm-d", "dra"): build(opts(arts["two"], target="llm-d")),
        ("llm-d", "device-plugin"): build(
            opts(arts["one"], target="llm-d", npu="device-plugin", plugin=False, artifact="hostpath:/data/qwen3-vl")
        ),
    }


def container(result) -> dict:
    return plain(result["objects"]["deployment.yaml"])["spec"]["template"]["spec"]["containers"][0]


def env_of(result) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(result)["env"]}


def texts(result) -> list[str]:
    """Every written text, the wheel's members included (unzipped: a key must not hide in a compressed file)."""
    import io
    import zipfile

    out = []
    for content in result["files"].values():
        if isinstance(content, bytes):
            with zipfile.ZipFile(io.BytesIO(content)) as zf:
                out += [zf.read(name).decode("utf-8", "replace") for name in zf.namelist()]
        else:
            out.append(content)
    return out


def validate(obj: dict) -> str:
    return kv.validate(plain(obj), K8S_VERSION, strict=True)


# ------------------------------------------------------------------------------------ derived, never retyped


def test_command_and_env_are_serves_with_the_pods_device_ids(arts, built):
    launch, _ = serve_command(ServeOptions(directory=arts["one"], host="0.0.0.0", no_auth=True), {})
    result = built[("kubernetes", "dra")]
    argv = container(result)["command"]
    assert argv[:2] == ["vllm", "serve"] and argv[2] == "/models/artifact"
    assert argv[3:] == launch.argv[3:]  # the same builder: every flag and value
    placement = {"rbln_config": {"device": 0, "visual": {"device": 0}}}  # the default vllm-rbln 0.11's flag
    assert json.loads(argv[argv.index("--additional-config") + 1]) == placement
    assert launch.env["RBLN_DEVICES"] == "1"  # serve: the host's NPU 1
    env = env_of(result)
    assert env["RBLN_DEVICES"] == "0"  # the pod: its one claimed NPU is 0
    assert {k: v for k, v in env.items() if k in launch.env and k != "RBLN_DEVICES"} == {
        k: v
        for k, v in launch.env.items()
        if k != "RBLN_DEVICES" and v is not None  # a pod drops unsets
    }
    assert result["spec"].pod.devices == 1


@pytest.mark.parametrize(
    ("version", "flag", "name"),
    [
        ("0.11.1a1", "--additional-config", "RBLN_DEVICES"),
        ("0.12.0", "--rbln-optimum-overrides", "RBLN_VISIBLE_DEVICES"),
    ],
)
def test_deploy_writes_the_line_serve_would_for_the_images_vllm_rbln(version, flag, name, arts):
    """--vllm-rbln picks the generation (never the vllm-rbln installed where deploy runs): the pod's command is
    serve's line for that version, the pod's NPU ids aside."""
    launch, _ = serve_command(ServeOptions(directory=arts["two"], host="0.0.0.0", no_auth=True, vllm_rbln=version), {})
    result = build(opts(arts["two"], vllm_rbln=version))
    argv = container(result)["command"]
    assert argv[3:] == launch.argv[3:] and flag in argv
    assert env_of(result)[name] == launch.env[name] == "0,1" and result["spec"].pod.devices == 2
    (engine,) = [c for c in result["spec"].pod.checks if c["check"] == "engine"]
    assert f"vllm-rbln {version} (chosen with --vllm-rbln)" in engine["detail"]
    default = [c for c in build(opts(arts["two"]))["spec"].pod.checks if c["check"] == "engine"]
    assert "no vllm-rbln installed here: the default 0.11.1a1" in default[0]["detail"]


def test_what_serve_refuses_deploy_refuses_with_the_same_message(tmp_path, arts):
    root = tmp_path / "edited"
    shutil.copytree(arts["one"], root)
    (root / "config.json").write_text((root / "config.json").read_text() + " ")  # changed since the compile
    with pytest.raises(InputError) as served:
        serve_command(ServeOptions(directory=root), {})
    with pytest.raises(InputError) as deployed:
        build(opts(root))
    assert deployed.value.message == served.value.message and "qvl-manifest.json" in served.value.message


def test_a_vit_on_its_own_npu_claims_two_devices_of_the_compiled_family(built):
    claim = plain(built[("llm-d", "dra")]["objects"]["resourceclaimtemplate.yaml"])
    request = claim["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert request["count"] == 2 and request["deviceClassName"] == "npu.rebellions.ai"
    assert request["selectors"][0]["cel"]["expression"].endswith('productName.startsWith("RBLN-CR")')
    assert env_of(built[("llm-d", "dra")])["RBLN_DEVICES"] == "0,1"
    resources = container(built[("kubernetes", "device-plugin")])["resources"]
    assert resources["requests"]["rebellions.ai/npu"] == resources["limits"]["rebellions.ai/npu"] == 2
    one = container(built[("llm-d", "device-plugin")])["resources"]
    assert one["limits"]["rebellions.ai/npu"] == 1


# ------------------------------------------------------------------------------ what a careful operator sets


def test_operator_fields_each_with_a_reason(built, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "sk-must-never-appear")
    result = build(opts(built[("kubernetes", "dra")]["spec"].pod.art.root, service_type="NodePort"))
    dep = plain(result["objects"]["deployment.yaml"])
    text = result["files"]["deployment.yaml"]
    assert dep["spec"]["strategy"] == {"type": "Recreate"} and "rolling update" in text
    c = container(result)
    assert {c[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe", "livenessProbe")} == {"/health"}
    probe = c["startupProbe"]
    budget = probe["initialDelaySeconds"] + probe["periodSeconds"] * probe["failureThreshold"]
    assert budget >= result["spec"].budget["budget_s"] and dep["spec"]["progressDeadlineSeconds"] > budget
    assert "stated conservative figure, not measured" in " ".join(text.split())
    assert text.count("An estimate, not measured") == 2  # the CPU and the host-memory requests
    assert env_of(result)["VLLM_API_KEY"] == {
        "secretKeyRef": {"name": "qwen3-vl-2b-instruct-api-key", "key": "api-key"}
    }
    assert all("sk-must-never-appear" not in t for t in texts(result))
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert volumes["shm"]["emptyDir"]["medium"] == "Memory" and "cache" in volumes
    assert env_of(result)["VLLM_CACHE_ROOT"].startswith("/cache")
    assert plain(result["objects"]["service.yaml"])["spec"]["type"] == "NodePort"
    assert plain(built[("kubernetes", "dra")]["objects"]["service.yaml"])["spec"]["type"] == "ClusterIP"


def test_a_measured_load_sizes_the_probe_and_an_emulated_one_is_refused(tmp_path, arts):
    from qwenvl_rbln.artifacts.manifest import graph_hash, read_manifest

    report = tmp_path / "load-check.json"
    runtime = {"attempted": True, "ok": True, "create_runtimes": True, "seconds": 150.0}
    runtime["graph_hash"] = graph_hash(arts["one"], read_manifest(arts["one"]))  # load-check writes it beside
    report.write_text(json.dumps({"emulated": False, "runtime": runtime}))
    result = build(opts(arts["one"], load_check=report))
    assert result["spec"].budget["budget_s"] == 480  # 3 x 150 s, rounded up to the minute
    assert "qvl load-check measured a load of 150 s" in " ".join(result["files"]["deployment.yaml"].split())
    report.write_text(json.dumps({"emulated": True, "runtime": runtime}))
    with pytest.raises(InputError, match="emulator"):
        build(opts(arts["one"], load_check=report))


def test_the_plugin_is_built_into_the_image_or_its_absence_is_costed(built):
    with_plugin = built[("kubernetes", "dra")]
    cf = with_plugin["files"]["Containerfile"]
    whl = f"qwenvl_rbln-{__version__}-py3-none-any.whl"
    assert f"FROM {IMAGE}\n" in cf and f"COPY {whl} " in cf
    assert with_plugin["pending"] == [whl] and whl not in with_plugin["files"]  # a dry run builds no wheel
    assert container(with_plugin)["image"] == f"{IMAGE}-qvl{__version__}"
    assert "import qwenvl_rbln.vllm_plugin, qwenvl_rbln.serving.key_guard" in cf  # the build fails, not the pod
    assert env_of(with_plugin)["QVL_FRAME_CAP"] == "1"
    without = built[("llm-d", "device-plugin")]
    assert "Containerfile" not in without["files"] and container(without)["image"] == IMAGE
    assert not [k for k in env_of(without) if k.startswith("QVL_")]
    header = " ".join(without["files"]["kustomization.yaml"].split())
    assert "no video frame cap" in header and "no ViT packing" in header
    checks = {c["check"]: c for c in without["spec"].pod.checks}
    assert not checks["vit packing"]["ok"] and "--no-plugin" in checks["video frame cap"]["detail"]


def test_llm_d_labels_router_values_and_the_prefill_estimate(built):
    from qwenvl_rbln.deploy.sizing import prefill_throughput

    result = built[("llm-d", "dra")]
    labels = plain(result["objects"]["deployment.yaml"])["spec"]["template"]["metadata"]["labels"]
    assert labels["llm-d.ai/guide"] == "optimized-baseline"
    assert labels["llm-d.ai/accelerator-vendor"] == "rebellions"
    values = yaml.safe_load(result["files"]["llm-d/router.values.yaml"])["router"]
    assert values["modelServers"]["matchLabels"].items() <= labels.items()
    config = yaml.safe_load(values["epp"]["pluginsCustomConfig"]["optimized-baseline-plugins.yaml"])
    (flt,) = [p for p in config["plugins"] if p["type"] == "prefix-cache-affinity-filter"]
    art = result["spec"].pod.art
    assert (
        flt["parameters"]["peakPrefillThroughput"]
        == prefill_throughput(art.model_config, art.cfg, "RBLN-CR13")["tokens_per_s"]
    )
    text = " ".join(result["files"]["llm-d/router.values.yaml"].split())
    assert "An estimate, not measured" in text and "roofline bound" in text
    assert "guides/optimized-baseline/modelserver/npu/vllm/patch-vllm.yaml" in text


# ------------------------------------------------------------------------------------------ validated offline


def test_every_object_is_valid_for_kubernetes_1_34_and_reads_back_as_built(built):
    assert "1.34" in kv.utils.all_versions() or any(v.startswith("1.34") for v in kv.utils.all_versions())
    kinds = set()
    for result in built.values():
        for path, obj in result["objects"].items():
            assert yaml.safe_load(result["files"][path]) == plain(obj)  # the comments change nothing
            assert validate(obj) == "1.34"
            kinds.add(obj["kind"])
        for path, obj in result["extra"].items():
            assert yaml.safe_load(result["files"][path]) == plain(obj)
    assert kinds == {"Deployment", "Service", "ResourceClaimTemplate"}
    sources = set()  # the three --artifact kinds, each a valid pod spec
    for result in built.values():
        pod = plain(result["objects"]["deployment.yaml"])["spec"]["template"]["spec"]
        (artifact,) = [v for v in pod["volumes"] if v["name"] == "artifact"]
        sources |= set(artifact) - {"name"}
    assert sources == {"persistentVolumeClaim", "emptyDir", "hostPath"}
    pool = plain(built[("llm-d", "dra")]["extra"]["llm-d/inferencepool.yaml"])
    # a CRD (inference.networking.k8s.io) has no schema in Kubernetes' own: checked structurally
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1" and pool["kind"] == "InferencePool"
    pod = container(built[("llm-d", "dra")])
    assert pool["spec"]["targetPorts"] == [{"number": pod["ports"][0]["containerPort"]}]
    labels = plain(built[("llm-d", "dra")]["objects"]["deployment.yaml"])["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    with pytest.raises(kv.utils.SchemaNotFoundError):  # said, not assumed: the CRD is not in the schemas
        kv.validate(pool, K8S_VERSION, strict=True)


def test_a_broken_object_fails_the_check(built):
    dep = plain(built[("kubernetes", "dra")]["objects"]["deployment.yaml"])
    dep["spec"]["strategy"]["rollingUpdate"] = {"maxSurge": 1}
    dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "eight thousand"
    with pytest.raises(kv.utils.ValidationError):
        kv.validate(dep, K8S_VERSION, strict=True)
    claim = plain(built[("kubernetes", "dra")]["objects"]["resourceclaimtemplate.yaml"])
    claim["spec"]["spec"]["devices"]["requests"][0]["exactly"]["cuont"] = 1  # a typo strict mode must catch
    with pytest.raises(kv.utils.ValidationError):
        kv.validate(claim, K8S_VERSION, strict=True)


def test_the_folder_builds_with_kubectl_kustomize(tmp_path, arts):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed here, so `kubectl kustomize` cannot build the folder")
    from qwenvl_rbln.deploy.write import write_folder

    result = build(opts(arts["two"], target="llm-d", namespace="serving", dry_run=False, out=tmp_path / "k"))
    out = write_folder(tmp_path / "k", result["files"], force=False)
    proc = subprocess.run([kubectl, "kustomize", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    docs = list(yaml.safe_load_all(proc.stdout))
    assert sorted(d["kind"] for d in docs) == ["Deployment", "ResourceClaimTemplate", "Service"]
    assert {d["metadata"]["namespace"] for d in docs} == {"serving"}
    for doc in docs:
        assert validate(doc) == "1.34"


# ------------------------------------------------------------------------------------------------ the command


def test_cli_writes_atomically_and_force_replaces_only_its_own_folder(tmp_path, arts, capsys):
    out = tmp_path / "k8s"
    args = ["deploy", str(arts["one"]), "--artifact", "hostpath:/data/qwen", "--image", IMAGE, "-o", str(out)]
    code, stdout, err = run_main([*args, "--json"], capsys)
    assert code == 0, err
    doc = json.loads(stdout)
    assert {f["path"] for f in doc["files"]} == {
        p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()
    } - {".qvl-deploy.json"}
    assert "Containerfile" in {f["path"] for f in doc["files"]} and "build and push" in doc["notes"][0]
    code, _, err = run_main(args, capsys)
    assert code == 2 and "--force" in err  # occupied: left untouched
    assert run_main([*args, "--force"], capsys)[0] == 0
    (out / "mine.txt").write_text("someone's file")
    code, _, err = run_main([*args, "--force"], capsys)
    assert code == 2 and "did not write" in err and (out / "mine.txt").exists()
    dry = tmp_path / "dry"
    code, stdout, _ = run_main([*args[:-1], str(dry), "--dry-run"], capsys)
    assert code == 0 and "# ---- deployment.yaml ----" in stdout and not dry.exists()
    code, _, err = run_main(["deploy", str(arts["one"]), "--artifact", "nfs:/x", "--image", IMAGE, "--dry-run"], capsys)
    assert code == 2 and "pvc:CLAIM" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--replicas", "0"], "--replicas 0"),
        (["--name", "Qwen_VL"], "not a Kubernetes name"),
        (["--npu", "gpu"], "--npu 'gpu'"),
        (["--artifact", "pvc:Bad_Claim"], "not a PersistentVolumeClaim name"),
        (["--artifact", "hostpath:relative/dir"], "must be absolute"),
        (["--image", ""], "not an image reference"),
    ],
)
def test_bad_options_are_one_line_input_errors(arts, capsys, extra, said):
    args = ["deploy", str(arts["one"]), "--artifact", "pvc:models", "--image", IMAGE, "--dry-run", *extra]
    code, out, err = run_main(args, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and said in lines[0] and "fix:" in lines[0], err


def test_no_output_folder_and_no_dry_run_is_refused(arts, capsys):
    code, _, err = run_main(["deploy", str(arts["one"]), "--artifact", "pvc:m", "--image", IMAGE], capsys)
    assert code == 2 and "-o OUT" in err


def test_a_decoder_that_needs_the_sort_without_the_plugin_names_the_crash_it_risks(arts):
    sorted_pod = build(opts(arts["two"]))  # batch 4, flash attention for RBLN-CR13: _requires_batch_sort
    assert env_of(sorted_pod)["QVL_SORT_DECODE"] == "1"  # serve's decode batch sort, in the pod too
    bare = build(opts(arts["two"], plugin=False))
    assert "QVL_SORT_DECODE" not in env_of(bare)
    (check,) = [c for c in bare["spec"].pod.checks if c["check"] == "decode sort"]
    assert not check["ok"] and "end the engine" in check["detail"]
    assert "end the" in " ".join(bare["files"]["kustomization.yaml"].replace("\n# ", " ").split())
    assert "QVL_SORT_DECODE" not in env_of(build(opts(arts["one"])))  # batch 1: nothing to sort


def test_a_profiled_prefill_chunk_replaces_the_routers_roofline_estimate(arts, tmp_path, monkeypatch):
    """qvl profile's measured chunk (real NPU entries of timings.json, of THIS artifact: its graph hash) is the
    router's peak prefill, labelled as measured; an emulated entry, or another artifact's, never is."""
    from qwenvl_rbln.artifacts.manifest import graph_hash
    from qwenvl_rbln.memory.calibration import model_key, prefill_key
    from qwenvl_rbln.planning.catalogue.modelinfo import geometry_from_config
    from qwenvl_rbln.tuning.measured import write_entry

    monkeypatch.setenv("QVL_HOME", str(tmp_path))
    plain_run = build(opts(arts["one"], target="llm-d"))
    art = plain_run["spec"].pod.art
    chunk = art.cfg["prefill_chunk_size"]
    block = art.cfg.get("kvcache_partition_len") or art.cfg["max_seq_len"]  # the key qvl profile writes
    point = {"context": 0, "median_s": chunk / 5000, "p10_s": chunk / 5100, "p90_s": chunk / 4900}
    entry = {
        "model_key": model_key(geometry_from_config(art.model_config, "artifact", "config.json")),
        "npu": "RBLN-CR13",
        "profiled_at": "2026-12-03T10:00:00Z",
        "graphs": {prefill_key(chunk, block): {"points": [point], "fit": None}},
        "graph_hash": graph_hash(art.root, art.manifest),
    }
    write_entry("other-artifact", {**entry, "graph_hash": "another artifact"}, emulated=False)
    write_entry("emulated-run", entry, emulated=True)
    assert (
        build(opts(arts["one"], target="llm-d"))["files"]["llm-d/router.values.yaml"]
        == plain_run["files"]["llm-d/router.values.yaml"]
    )  # emulated figures are never an NPU's
    write_entry("npu-run", entry, emulated=False)
    text = build(opts(arts["one"], target="llm-d"))["files"]["llm-d/router.values.yaml"]
    config = yaml.safe_load(
        yaml.safe_load(text)["router"]["epp"]["pluginsCustomConfig"]["optimized-baseline-plugins.yaml"]
    )
    (flt,) = [p for p in config["plugins"] if p["type"] == "prefix-cache-affinity-filter"]
    assert flt["parameters"]["peakPrefillThroughput"] == 5000
    words = " ".join(text.split())
    assert "Measured by `qvl profile` on the NPU (measured (RBLN-CR13, 2026-12-03" in words
    assert "An estimate, not measured" not in words
