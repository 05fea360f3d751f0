"""`qvl deploy` hardening: the 2026-12-04 new-user audit (H13, L7, L8, L9, L10), the mutation audit's survivors in
deploy (D2, D4, D6, D7) and the upstream audit's start-up facts (findings 1, 7, 8, 10, 12). Each test names what it
covers; each failed on the code before its fix.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from qwenvl_rbln.artifacts.manifest import write_manifest
from qwenvl_rbln.deploy.build import build
from qwenvl_rbln.deploy.options import MAX_NAME, DeployOptions, check_name
from qwenvl_rbln.deploy.yamltext import plain
from qwenvl_rbln.errors import InputError
from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import deploy_artifact, run_main, write_artifact

IMAGE = "registry.internal/vllm-rbln:0.12.0"


pytestmark = pytest.mark.usefixtures("own_qvl_home")  # tests/conftest.py


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    return deploy_artifact(tmp_path_factory.mktemp("hardening") / "one")


def opts(directory: Path, **kw) -> DeployOptions:
    return DeployOptions(**{"directory": directory, "artifact": "pvc:m", "image": IMAGE, "dry_run": True, **kw})


def deployment(result) -> dict:
    return plain(result["objects"]["deployment.yaml"])


def container(result) -> dict:
    return deployment(result)["spec"]["template"]["spec"]["containers"][0]


def env_of(result) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(result)["env"]}


def words(text: str) -> str:
    return " ".join(text.replace("# ", " ").split())


def refused(argv: list[str], capsys) -> str:
    code, out, err = run_main(argv, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "fix:" in lines[0], (code, out, err)
    assert "internal error" not in err and "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------------------------- H13: -o . and the like


def test_o_dot_never_replaces_the_working_directory(tmp_path, art, capsys, monkeypatch):
    """Before: `-o .` renamed a new folder over the (empty) working directory, leaving the shell in a deleted one;
    the `--force` rerun was `qvl: internal error: FileNotFoundError`."""
    here = tmp_path / "h13"
    here.mkdir()
    monkeypatch.chdir(here)
    inode = here.stat().st_ino
    base = ["deploy", str(art), "--artifact", "pvc:models", "--image", IMAGE]
    for out, force in ((".", False), (".", True), (str(here), False), ("..", True)):
        line = refused([*base, "-o", out, *(["--force"] if force else [])], capsys)
        assert "is the working directory" in line and "nothing was written" in line
    assert Path.cwd().stat().st_ino == inode and os.listdir(here) == []
    assert run_main([*base, "-o", "k8s", "--json"], capsys)[0] == 0  # a folder of its own is fine
    monkeypatch.chdir(here / "k8s")  # a deploy folder, entered: `--force -o .` would replace it under the shell
    line = refused([*base, "-o", ".", "--force"], capsys)
    assert "is the working directory" in line and (here / "k8s" / "deployment.yaml").is_file()


def test_a_deleted_working_directory_is_one_line(tmp_path, art, capsys, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    out = tmp_path / "k8s"
    line = refused(["deploy", str(art), "--artifact", "pvc:m", "--image", IMAGE, "-o", str(out)], capsys)
    assert "working directory no longer exists" in line and not out.exists()
    line = refused(["deploy", str(art), "--artifact", "pvc:m", "--image", IMAGE, "--dry-run"], capsys)
    assert "working directory no longer exists" in line


def test_force_refuses_a_folder_with_a_users_file_in_a_subfolder(tmp_path, art):
    """Mutation D4 (only top-level files compared with the marker): `--force` deleted overlays/prod.yaml."""
    from qwenvl_rbln.deploy.write import write_folder

    out = tmp_path / "k8s"
    files = build(opts(art, plugin=False))["files"]
    write_folder(out, files, force=False)
    (out / "overlays").mkdir()
    (out / "overlays" / "prod.yaml").write_text("someone's overlay")
    with pytest.raises(InputError, match="overlays/prod.yaml"):
        write_folder(out, files, force=True)
    assert (out / "overlays" / "prod.yaml").read_text() == "someone's overlay"


# ----------------------------------------------------------------------------------------- D2, D6, D7: numbers


@pytest.mark.parametrize("measured", [None, 150.0])
def test_the_progress_deadline_covers_the_whole_startup_window_and_the_pull(tmp_path, art, measured):
    """Mutation D2 (the probe's initial delay left out of the deadline): the test only asked deadline > window."""
    from qwenvl_rbln.deploy.sizing import PULL_S

    if measured is not None:
        from qwenvl_rbln.artifacts.load_times import record_load

        record_load(art, measured, tmp_path / "home" / "load-times.json")
    result = build(opts(art))
    assert (result["spec"].budget["measured_s"] is None) == (measured is None)
    probe = container(result)["startupProbe"]
    window = probe["initialDelaySeconds"] + probe["periodSeconds"] * probe["failureThreshold"]
    assert deployment(result)["spec"]["progressDeadlineSeconds"] >= window + PULL_S


def test_api_key_secret_names_the_secret_the_pods_read(art):
    """Mutation D6 (always NAME-api-key): no test passed --api-key-secret."""
    result = build(opts(art, api_key_secret="team-key"))
    assert env_of(result)["VLLM_API_KEY"] == {"secretKeyRef": {"name": "team-key", "key": "api-key"}}
    assert "kubectl create secret generic team-key " in words(result["files"]["kustomization.yaml"])


def test_a_name_of_exactly_max_name_characters_is_accepted():
    """Mutation D7 (`len > MAX_NAME` as `>=`): a 40-character name was refused."""
    assert check_name("--name", "a" * MAX_NAME) == "a" * MAX_NAME
    with pytest.raises(InputError, match=f"at most {MAX_NAME} characters"):
        check_name("--name", "a" * (MAX_NAME + 1))


# ------------------------------------------------------------------------------------ L7, L8, L9: the options


@pytest.mark.parametrize(
    ("flag", "fix"),
    [(["--api-key", "sk-secret"], "--api-key-secret"), (["--api-key=sk-secret"], "--api-key-secret"),
     (["--host", "1.2.3.4"], "0.0.0.0"), (["--port", "9000"], "Service"),
     (["--served-model-name", "x"], "qvl deploy --served-model-name")],
)  # fmt: skip
def test_pass_through_flags_deploy_sets_get_deploys_fix(art, capsys, flag, fix):
    """L7: the refusals said `export VLLM_API_KEY=KEY or pass --api-key-file` and `use qvl serve --host`."""
    args = ["deploy", str(art), "--artifact", "pvc:models", "--image", IMAGE, "--dry-run", "--", *flag]
    line = refused(args, capsys)
    assert "is set by qvl deploy" in line and "nothing was written" in line and fix in line.split("fix:", 1)[1]
    assert "qvl serve" not in line and "--api-key-file" not in line and "sk-secret" not in line


def test_claim_and_namespace_names_follow_kubernetes_rules(art, capsys):
    """L8: `pvc:models.v1` (a DNS subdomain) and a 50-character namespace (a DNS label of up to 63) were refused."""
    claim = plain(build(opts(art, artifact="pvc:models.v1/qwen"))["objects"]["deployment.yaml"])
    (volume,) = [v for v in claim["spec"]["template"]["spec"]["volumes"] if v["name"] == "artifact"]
    assert volume["persistentVolumeClaim"]["claimName"] == "models.v1"
    for namespace in ("n" * 50, "n" * 63, "1team"):
        assert build(opts(art, namespace=namespace))["spec"].opts.namespace == namespace
    assert build(opts(art, api_key_secret="team.key"))["spec"].secret == "team.key"  # a Secret: a subdomain too
    for bad in ("n" * 64, "Serving", "-x", "a.b"):
        with pytest.raises(InputError, match="not a Kubernetes namespace name"):
            opts(art, namespace=bad)
    for bad in ("Models", "models.", "a..b", "-m", "m" * 254):
        with pytest.raises(InputError, match="not a PersistentVolumeClaim name"):
            build(opts(art, artifact=f"pvc:{bad}"))


def test_a_missing_required_option_is_named_not_spelled_none(art, capsys):
    """L10: `--artifact None: say where ...` and `--image None: not an image reference` (Python's None)."""
    line = refused(["deploy", str(art), "--image", IMAGE, "--dry-run"], capsys)
    assert "no --artifact: say where the pods find" in line and "None" not in line
    line = refused(["deploy", str(art), "--artifact", "pvc:m", "--dry-run"], capsys)
    assert "no --image: the image is required" in line and "None" not in line


def test_api_key_secret_with_no_auth_is_a_conflict(art, capsys):
    """L9: accepted silently, the Secret name ignored."""
    args = ["deploy", str(art), "--artifact", "pvc:models", "--image", IMAGE, "--dry-run"]
    line = refused([*args, "--api-key-secret", "good", "--no-auth"], capsys)
    assert "conflicting flags" in line and "--api-key-secret good" in line and "--no-auth" in line


# ------------------------------------------------------------------------------------------- L10: said once


def test_no_plugin_has_one_warn_line_per_cause(art, capsys):
    """L10: `# warn video frame cap` and `# warn video cap` both said 'no video frame cap'."""
    args = ["deploy", str(art), "--artifact", "pvc:models", "--image", IMAGE, "--no-plugin", "--dry-run"]
    code, out, err = run_main(args, capsys)
    assert code == 0, err
    warns = [line for line in out.splitlines() if line.startswith("# warn ")]
    assert sum("no video frame cap" in line for line in warns) == 1
    assert sum("no ViT packing" in line for line in warns) == 1


def test_a_warning_the_checks_show_is_not_repeated_on_stderr(tmp_path, capsys):
    """A warning that is also a check was printed twice (stderr `warning:` and `# warn`): here the video modality a
    16384-token context turns off. (The short KV pool this test used before is now refused outright.)"""
    plan = build_plan("rebel100-1npu", ["max_seq_len=16384"])
    short = tmp_path / "short"
    write_artifact(short, plan)
    write_manifest(short, {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": "m"}})
    args = ["deploy", str(short), "--artifact", "pvc:models", "--image", IMAGE, "--dry-run"]
    code, out, err = run_main(args, capsys)
    assert code == 0, err
    said = (out + err).count("limit_mm_per_prompt video is 0")
    assert said == 1 and "# warn limit_mm_per_prompt:" in out


# ------------------------------------------------------------------------------- upstream 1, 7, 8, 10, 12


def test_the_api_key_is_said_to_guard_every_route_but_the_public_ones(art):
    """Upstream finding 1 and round 5 F1: the key guards every route but the public list (qvl's key guard: vLLM 0.22
    alone leaves /invocations open); the manifests once said /v1 only, then that vLLM guarded the rest."""
    from qwenvl_rbln.serving.public_routes import PUBLIC_ROUTES

    text = words(build(opts(art, service_type="NodePort"))["files"]["deployment.yaml"])
    assert f"every route except {', '.join(PUBLIC_ROUTES)}" in text and "qvl's key guard" in text
    service = words(build(opts(art, service_type="NodePort"))["files"]["service.yaml"])
    assert "the API key guards every route except" in service and "guards /v1." not in service
    assert "requires this key on /v1 when set" not in text


def test_vllms_engine_ready_timeout_is_at_least_the_startup_window(tmp_path, art):
    """Upstream finding 10 (round 5 F5): VLLM_ENGINE_READY_TIMEOUT_S is set to the probe's window, so no vLLM that
    times its start with it gives up before the probe. vLLM 0.22's single-API-server line does not bound the model
    load with it (the note must not say it does)."""
    result = build(opts(art))
    probe = container(result)["startupProbe"]
    window = probe["initialDelaySeconds"] + probe["periodSeconds"] * probe["failureThreshold"]
    assert int(env_of(result)["VLLM_ENGINE_READY_TIMEOUT_S"]) == window > 600
    assert "VLLM_ENGINE_READY_TIMEOUT_S" in env_of(build(opts(art, plugin=False)))  # vLLM's own: always set
    text = words(build(opts(art))["files"]["deployment.yaml"])
    assert "does not bound the model load with it" in text and "waits for its engine to load" not in text


def test_llm_d_pods_carry_only_the_guides_labels(art):
    """Upstream finding 8: `llm-d.ai/inference-serving` is set by no llm-d guide file; it was called the guide's."""
    result = build(opts(art, target="llm-d"))
    labels = deployment(result)["spec"]["template"]["metadata"]["labels"]
    assert {k for k in labels if k.startswith("llm-d.ai/")} == {
        "llm-d.ai/guide", "llm-d.ai/model", "llm-d.ai/role", "llm-d.ai/accelerator-variant",
        "llm-d.ai/accelerator-vendor"}  # fmt: skip
    assert all("inference-serving" not in t for t in result["files"].values() if isinstance(t, str))


ROUTER_FILTER_FIELDS = {  # llm-d-router's prefix-cache-affinity-filter parameters (its README's Config table)
    "affinityThreshold", "explorationProbability", "maxTTFTPenaltyMs", "ttftSource", "peakPrefillThroughput",
    "prefillCalibrationFile", "prefillCalibrationFingerprint", "prefillCalibrationRequired"}  # fmt: skip


def test_router_values_keep_the_guides_filter_parameters_or_say_why_not(art):
    """Upstream finding 7: qvl's plugins string replaced the guide's and set only peakPrefillThroughput, so the
    filter ran with the router's defaults (maxTTFTPenaltyMs 18000) instead of the guide's policy, unsaid."""
    text = build(opts(art, target="llm-d"))["files"]["llm-d/router.values.yaml"]
    config = yaml.safe_load(
        yaml.safe_load(text)["router"]["epp"]["pluginsCustomConfig"]["optimized-baseline-plugins.yaml"]
    )
    (flt,) = [p for p in config["plugins"] if p["type"] == "prefix-cache-affinity-filter"]
    params = flt["parameters"]
    assert params["affinityThreshold"] == 0.80 and params["maxTTFTPenaltyMs"] == 0 and params["peakPrefillThroughput"]
    assert set(params) <= ROUTER_FILTER_FIELDS  # the router's strict decoder refuses any other key
    said = words(text)
    assert "except maxTokensInFlightPenalty, left out: it is not a field" in said
    assert "peakPrefillThroughput below is read only once you set this" in said


def test_device_plugin_names_the_legacy_rebel_resource(art):
    """Upstream finding 12: a device plugin without --use-generic-resource-name exposes rebellions.ai/REBEL."""
    text = words(build(opts(art, npu="device-plugin"))["files"]["deployment.yaml"])
    assert "rebellions.ai/REBEL" in text and "--use-generic-resource-name" in text
    assert "rebellions.ai/REBEL" in Path(__file__).resolve().parent.parent.joinpath("docs/cluster.md").read_text()


# ------------------------------------------------------------------------------------- one size, two readers


def test_one_folder_size_counts_a_hard_linked_file_once(tmp_path, art, monkeypatch):
    """deploy/sizing.artifact_bytes (stat) and cache_admin._size (lstat) were two functions for one job, and
    deploy's counted a hard-linked file twice; now both call manifest.tree_bytes."""
    from qwenvl_rbln.artifacts import cache_admin, manifest
    from qwenvl_rbln.artifacts.manifest import tree_bytes

    assert cache_admin.tree_bytes is manifest.tree_bytes and not hasattr(cache_admin, "_size")

    copy = tmp_path / "linked"
    shutil.copytree(art, copy)
    before = tree_bytes(copy)
    os.link(copy / "prefill.rbln", copy / "prefill-copy.rbln")
    assert tree_bytes(copy) == before
    (copy / "prefill-copy.rbln").unlink()
    seen = []
    monkeypatch.setattr("qwenvl_rbln.deploy.build.tree_bytes", lambda root: seen.append(root) or 12345)
    result = build(opts(copy))
    assert seen == [copy] and "0.0 GiB artifact" in words(result["files"]["deployment.yaml"])


def test_every_pod_runs_the_key_guard_unless_the_image_has_no_qvl(art):
    """Round 5 F1 / N1: a pod runs serve's own line, key guard included (vLLM alone answers /invocations without
    the key); an image without qvl cannot import it, so --no-plugin drops it and says what that exposes."""
    from qwenvl_rbln.serving.options import KEY_GUARD

    def line(result) -> str:
        return " ".join(container(result)["command"] + container(result).get("args", []))

    assert f"--middleware {KEY_GUARD}" in line(build(opts(art)))
    without = build(opts(art, plugin=False))
    assert KEY_GUARD not in line(without) and "--middleware" not in line(without)
    text = words(without["files"]["kustomization.yaml"])
    assert "no key guard" in text and "/invocations" in text
    (check,) = [c for c in without["spec"].pod.checks if c["check"] == "key guard"]
    assert not check["ok"] and "/invocations" in check["detail"]
