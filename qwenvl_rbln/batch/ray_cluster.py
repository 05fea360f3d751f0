"""The Ray that runs a many-NPU batch: import it, start it (or join one), and check it can do the job before any work.

Why each check exists: a task that asks for ``{"RBLN": k}`` on a Ray without that resource (``rebel`` does not
import on a node, so ray's detection in ``ray/_private/accelerators/rbln.py`` counts 0 and swallows the error) waits
forever; a worker that cannot read the artifact fails minutes later, after loading torch. Both are refused here in
seconds, naming what is missing and where.

Ray stays an optional extra: nothing here imports it at module level (``qvl --help`` and the one-NPU path never do).

A Ray that qvl starts is air-gap friendly: usage statistics off (``RAY_USAGE_STATS_ENABLED=0`` unless the user set
it), no dashboard, Ray's own logs kept off the terminal. Ray 2.60 turns token authentication on for a new local
cluster and keeps the token in ``~/.ray/auth_token`` (it creates it once); qvl leaves that default alone (the
raylet listens on the host's address, the token keeps others out) and tests point ``HOME`` at a temporary folder.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import BackendError, DependencyMissing, InputError

INSTALL_LINE = "pip install 'qwenvl-rbln[ray]'  (or `make install`, which installs the extra)"
RBLN = "RBLN"
VISIBLE_ENV = "RBLN_DEVICES"  # ray/_private/accelerators/rbln.py: RBLN_RT_VISIBLE_DEVICES_ENV_VAR
# The environment a worker must share with the driver, whichever node it runs on.
FORWARDED_PREFIXES = ("QVL_", "HF_", "TRANSFORMERS_", "TOKENIZERS_")
ARTIFACT_PROBE_S = 30.0
FREE_WAIT_S = 20.0  # NPUs held by another job (or just released): how long to wait for them
CONNECT_PROBE_S = 5.0  # --ray-address HOST:PORT: how long to wait for the head to answer


def ensure_ray() -> Any:
    """``import ray``, or DependencyMissing (exit 3) with the install line."""
    try:
        import ray
    except ImportError as exc:
        raise DependencyMissing(
            f"--workers, --devices and --ray-address need Ray, which is not installed ({exc})", INSTALL_LINE
        ) from None
    return ray


def forwarded_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The QVL_* / HF_* settings of the driver, for every worker's ``runtime_env`` (a remote node lacks them)."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if k.startswith(FORWARDED_PREFIXES)}


def start_or_connect(address: str | None, *, emulate: bool = False, devices: list[int] | None = None) -> bool:
    """Join ``address`` (``auto`` or host:port), or start a local Ray; True when qvl started it (and must stop it).

    ``--devices 0,2`` pins a local Ray to those NPUs: Ray reads ``RBLN_DEVICES`` of the process that starts it as
    the node's visible devices, counts only those and hands each worker one of the listed ids (not an index). The
    ids were checked against the host's NPUs before (``check_devices_exist``, when the pool was made).
    With ``emulate`` the emulator answers ``rebel.device_count()`` in this process, so the local node reports
    ``RBLN: QVL_EMULATOR_DEVICES``.
    """
    ray = ensure_ray()
    if ray.is_initialized():
        return False
    quiet = {"include_dashboard": False, "logging_level": "ERROR", "log_to_driver": False, "configure_logging": True}
    if address:
        if devices is not None:
            raise InputError(
                "--devices pins the NPUs of a Ray that qvl starts on this host; it does not apply to --ray-address",
                "use --workers N with --ray-address (Ray places each worker on a node with a free NPU)",
            )
        if address != "auto":
            check_reachable(address)  # Ray's own connect retries for minutes; this answers in seconds
        _init(ray, address=address, **{k: v for k, v in quiet.items() if k != "include_dashboard"})
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if emulate:
        from qwenvl_rbln.backends import emulator

        emulator.activate()
    saved = os.environ.get(VISIBLE_ENV)
    if devices is not None:
        os.environ[VISIBLE_ENV] = ",".join(str(d) for d in devices)
    try:
        _init(ray, **quiet)
    finally:
        if devices is not None:
            if saved is None:
                os.environ.pop(VISIBLE_ENV, None)
            else:
                os.environ[VISIBLE_ENV] = saved
    return True


def host_npu_count() -> int | None:
    """NPUs this host has, as Ray will count them (``rebel.device_count()``: the emulator's with --emulate); None
    when ``rebel`` does not answer here (Ray then finds no NPU, which ``check_cluster`` reports)."""
    try:
        from rebel import device_count
    except Exception:  # noqa: BLE001 - not installed, or broken: the same for Ray's detection
        return None
    try:
        return int(device_count())
    except Exception:  # noqa: BLE001
        return None


def check_devices_exist(devices: list[int]) -> None:
    """``--devices`` ids the host does not have are refused before Ray starts (Ray would hand them out anyway:
    it counts ``min(device_count, len(RBLN_DEVICES))`` NPUs and gives each worker a listed id)."""
    count = host_npu_count()
    if count is None:
        return
    missing = [d for d in devices if d >= count]
    if missing:
        have = f"NPUs 0-{count - 1}" if count > 1 else ("NPU 0" if count == 1 else "no NPU")
        raise InputError(
            f"--devices {','.join(map(str, devices))}: this host has {count} NPU{'s' if count != 1 else ''} "
            f"({have}); {', '.join(map(str, missing))} {'is' if len(missing) == 1 else 'are'} not one of them",
            f"list ids from 0 to {count - 1} (`rbln-smi` shows them)" if count else "run on a host with NPUs",
        )


def _host_port(address: str) -> tuple[str, int]:
    """HOST and PORT of ``HOST:PORT`` (``[v6]:PORT`` too); a ``ray://`` address never gets here (options.py)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + empty SETTINGS


def check_reachable(address: str, timeout: float = CONNECT_PROBE_S) -> None:
    """BackendError in at most ``2 * timeout`` seconds unless a Ray head answers at ``address`` (HOST:PORT).

    Ray's own ``ray.init(address=...)`` retries for about ten minutes when nothing (or something else) listens
    there. A Ray head's GCS is a gRPC server, so it answers HTTP/2's connection preface with a SETTINGS frame."""
    import socket

    host, port = _host_port(address)
    fix = "check the address (`ray status` on the head node prints it) or drop --ray-address to start a local Ray"
    try:
        conn = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise BackendError(
            f"cannot reach the Ray cluster at --ray-address {address}: nothing answers at {host}:{port} ({why}; "
            f"waited at most {timeout:.0f} s)",
            fix,
        ) from None
    try:
        conn.settimeout(timeout)
        conn.sendall(_H2_PREFACE)
        head = b""
        while len(head) < 9:
            chunk = conn.recv(9 - len(head))
            if not chunk:
                break
            head += chunk
    except OSError:
        head = b""
    finally:
        conn.close()
    if len(head) < 9 or head[3] != 0x04:
        raise BackendError(
            f"--ray-address {address}: {host}:{port} answers, but not as a Ray head (no gRPC answer within "
            f"{timeout:.0f} s)",
            fix,
        )


def _init(ray: Any, **kwargs: Any) -> None:
    try:
        ray.init(**kwargs)
    except ConnectionError as exc:
        raise BackendError(
            f"cannot reach the Ray cluster at --ray-address {kwargs.get('address')}: {exc}",
            "check the address (`ray status` on the head node prints it) or drop --ray-address to start a local Ray",
        ) from None
    _keep_stdout_clean()


def _keep_stdout_clean() -> None:
    """Ray's driver prints the cluster's error notes ("(raylet) A worker died ...") on STDOUT from a background
    thread (ray 2.60 ``_private/worker.py``: ``listen_error_messages`` -> ``print_to_stdstream``), which would break
    ``--json`` and the live view. qvl reports a dead worker itself (its state, and the error in the records), so
    those notes go to the ``ray`` logger at debug level instead. Ray's workers' own logs are already off
    (``log_to_driver=False``)."""
    import logging

    try:
        import ray._private.worker as ray_worker
    except ImportError:
        return
    original = getattr(ray_worker, "print_to_stdstream", None)
    if original is None or getattr(original, "qvl_quiet", False):
        return

    def quiet(data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") == "raylet":
            logging.getLogger("ray").debug("%s", " ".join(data.get("lines") or []))
            return
        original(data, ignore_prefix)

    quiet.qvl_quiet = True  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = quiet


def rbln_nodes(nodes: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Alive nodes with their RBLN count: [{"id", "name", "rbln"}] (rbln 0 when the node has none)."""
    out = []
    for node in nodes:
        if not node.get("Alive", node.get("alive")):
            continue
        name = node.get("NodeManagerHostname") or node.get("NodeManagerAddress") or node.get("NodeID")
        out.append({"id": node["NodeID"], "name": str(name), "rbln": int(node.get("Resources", {}).get(RBLN, 0))})
    return out


def plan_workers(nodes: list[dict[str, Any]], workers: int | None, per_worker: int, available: float | None) -> int:
    """How many workers to start; BackendError / InputError naming what is missing when the cluster cannot hold them.

    A worker needs ``per_worker`` NPUs on ONE node, so a node holds ``rbln // per_worker`` of them. ``workers=None``
    means every NPU the cluster has.
    """
    total = sum(n["rbln"] for n in nodes)
    if total == 0:
        names = ", ".join(n["name"] for n in nodes) or "no alive node"
        raise BackendError(
            f"the Ray cluster has no {RBLN} resource (nodes: {names}): a worker asking for one would wait forever",
            "Ray counts a node's NPUs with `rebel.device_count()`: check `python -c 'import rebel; "
            "print(rebel.device_count())'` on each node (rebel-compiler installed, NPUs visible), or use --emulate",
        )
    capacity = sum(n["rbln"] // per_worker for n in nodes)
    want = capacity if workers is None else workers
    if want < 1:
        raise BackendError(
            f"no node has {per_worker} NPUs for one worker (this artifact places its graphs on {per_worker} NPUs; "
            f"nodes: {_node_list(nodes)})",
            "compile with the ViT on the language model's NPU, or add a node with more NPUs",
        )
    if want > capacity:
        raise InputError(
            f"--workers/--devices ask for {want} workers of {per_worker} NPU(s) each, but the Ray cluster holds "
            f"{capacity} ({RBLN} per node: {_node_list(nodes)})",
            f"use --workers {capacity} or fewer" if capacity else "add NPUs to the cluster",
        )
    if available is not None and available < want * per_worker:
        raise BackendError(
            f"the Ray cluster has {int(available)} free {RBLN} of {total}; {want} workers need {want * per_worker} "
            f"(another job holds the rest; waited {FREE_WAIT_S:.0f} s)",
            f"wait for it, or use --workers {int(available) // per_worker}",
        )
    return want


def _node_list(nodes: list[dict[str, Any]]) -> str:
    return ", ".join(f"{n['name']}={n['rbln']}" for n in nodes)


def check_cluster(
    ray: Any, workers: int | None, per_worker: int, wait_free_s: float = FREE_WAIT_S
) -> tuple[int, list[dict[str, Any]]]:
    """The number of workers to start and the alive nodes. A missing resource fails at once; NPUs that exist but
    are held (another job, or actors just killed that Ray has not released yet) are waited for ``wait_free_s``."""
    nodes = rbln_nodes(ray.nodes())
    count = plan_workers(nodes, workers, per_worker, None)
    end = time.monotonic() + wait_free_s
    while ray.available_resources().get(RBLN, 0.0) < count * per_worker and time.monotonic() < end:
        time.sleep(0.1)
    return plan_workers(nodes, workers, per_worker, ray.available_resources().get(RBLN, 0.0)), nodes


def _stat_artifact(path: str) -> dict[str, Any]:
    """Runs ON a node: can this process read the artifact? (a tiny task: no torch, no qvl import needed)."""
    import socket

    p = Path(path)
    out: dict[str, Any] = {"host": socket.gethostname()}
    try:
        names = ["qvl-manifest.json", "rbln_config.json", "config.json"]
        probe = next((p / n for n in names if (p / n).is_file()), None)
        if probe is None:
            out["error"] = f"{path} holds none of {', '.join(names)}" if p.is_dir() else f"{path} is not a folder"
        else:
            with probe.open("rb") as fh:
                fh.read(1)
    except OSError as exc:
        out["error"] = f"cannot read {path}: {exc}"
    return out


def check_artifact_on_nodes(ray: Any, path: str | os.PathLike, nodes: list[dict[str, Any]]) -> None:
    """One tiny task per NPU node (node affinity, not soft) reads the artifact; BackendError naming each failing node.

    The artifact must sit at the same path on every node that runs a worker (a shared filesystem or a copy).
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0, max_retries=0)(_stat_artifact)
    targets = [n for n in nodes if n["rbln"] > 0] or nodes
    refs = {
        probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["id"], soft=False)).remote(str(path)): n
        for n in targets
    }
    ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=ARTIFACT_PROBE_S)
    problems = []
    for ref in ready:
        try:
            res = ray.get(ref)
        except Exception as exc:  # the probe itself died on that node
            res = {"error": f"the check failed: {exc}"}
        if res.get("error"):
            problems.append(f"node {refs[ref]['name']}: {res['error']}")
    problems += [f"node {refs[ref]['name']}: did not answer within {ARTIFACT_PROBE_S:.0f} s" for ref in late]
    for ref in late:
        ray.cancel(ref, force=True)
    if problems:
        raise BackendError(
            "the artifact is not readable on every node that runs a worker: " + "; ".join(problems),
            f"put the artifact at {path} on every node (a shared filesystem or a copy at the same path)",
        )
