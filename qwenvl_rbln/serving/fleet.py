"""``qvl serve --workers N`` / ``--devices LIST``: one vLLM engine per replica's NPU(s), ``vllm-router`` in front.

A Rebel100 replica of Qwen3-VL uses one NPU (two with the ViT on its own), so a host's NPUs serve online as several
engines behind a router (``shared/reference/scale-out-and-measurement.md``). qvl does not balance requests itself:
vllm-router does (policies, health checks, retries with backoff, a circuit breaker, a queue, metrics). This module
builds the fleet as data, like ``command.py`` builds one engine's line; ``fleet_run.py`` runs it.

* The artifact is checked **once** (``preflight``), and every replica's line is built from that one result by
  ``command.vllm_launch``, the builder ``qvl serve`` uses for one engine: the same argv but its port, and the
  device variable of the vllm-rbln at hand (``Engine.device_env``) naming its own NPUs. Each replica takes
  ``per_replica`` NPUs (the devices the compiled placement uses) from ``--devices`` in order, or from 0 up with
  ``--workers``; the placement positions inside that list stay the compiled ones.
* Engines listen on loopback only (``127.0.0.1``, ports ``--port + 1`` and up), the router's metrics on the next
  one; the router on ``--host``/``--port``, or, with a key or off loopback, on the port after the metrics behind
  qvl's front door (``front_door.py``), which takes ``--host``/``--port``.
* The router's policy is ``power_of_two`` (the less loaded of two engines, by the router's own count of requests
  in flight). A Qwen3-VL chat costs from a short text to several ViT buckets and a long prefill, and a replica's
  compiled batch is small (2-16), so the load must count at every request: ``round_robin``'s equal counts queue
  behind a long request (measured: the same throughput, a 31 % higher median TTFT), and ``cache_aware`` (the
  router's default) balances by load only once two engines are 64 requests apart, far beyond a Rebel100 batch; it
  buys nothing else here, since vllm-rbln 0.11.1a1 turns prefix caching off for every multimodal model, Qwen3-VL
  included (``platform.py``, ``disable_unsupported_prefix_caching``). ``benchmarks/bench_fleet.py``, figures in
  ``benchmarks/README.md``. One replica runs ``round_robin``: vllm-router refuses ``power_of_two`` with fewer than
  two workers, and with one there is nothing to choose.
* ``power_of_two`` makes the router ask every engine ``GET /get_load`` each second; vLLM has no such route (and its
  ``/load`` is 0 without ``--enable-server-load-tracking``), so the policy runs on the router's own counts, which is
  what it needs. The engines answer the probe as any other unknown or keyed route (404, or 401 with a key), and
  leave it and the health checks (``/health``, every 2 s from the router and from qvl) out of their access logs.
* ``--router-args '...'`` passes flags to vllm-router (as ``-- ...`` passes vLLM's); the ones qvl sets are refused.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.serving import emulated
from qwenvl_rbln.serving.command import check_serve, placement, replica_launch
from qwenvl_rbln.serving.flags import parse_flags
from qwenvl_rbln.serving.options import (
    API_KEY_ENV,
    Launch,
    ServeOptions,
    api_key,
    host_port,
    is_loopback,
)
from qwenvl_rbln.serving.preflight import ok, warn

ENGINE_HOST = "127.0.0.1"
ROUTER = "vllm-router"
# vllm-router's power_of_two polls each engine's /get_load (a route vLLM 0.22 lacks: 404, answered by the router's
# own count) every 5 s: an access-log line per engine that says nothing (audit 2026-12-06 L9)
POLICY = "power_of_two"
ONE_REPLICA_POLICY = "round_robin"  # vllm-router refuses power_of_two with one worker ("requires at least 2")
NEEDS_TWO = ("power_of_two",)
QUIET = ("/health", "/get_load")  # the probes every engine gets each 1-2 s, kept out of its access log
# the router's health check every 2 s, one miss takes an engine out and one answer puts it back. It listens once ONE
# engine answers /health (vllm-router 0.1.17), so qvl starts it only once every engine has (fleet_run.py); the
# startup bound is long (an engine's first start may take many minutes; qvl gives up before). A request that fails
# on an engine that just died is retried (the router picks again each time, and a dead engine's count of requests
# in flight is 0, so it may be picked again): 8 tries, 7 waits of 100 ms x 1.5^i, about 3.2 s (2.6-3.9 s with the
# router's jitter), longer than the health check takes to put the dead engine out of rotation (its default, 5 tries
# over about 0.4 s, is shorter). One request's tries do not open a circuit: that takes 10 failures on an engine
# (the router's --cb-failure-threshold); the health check is what takes a dead engine out. An open circuit is
# tried again after 5 s (not the router's default 60 s), so an engine qvl restarted is back in rotation as soon as
# its /health answers
ROUTER_DEFAULTS = (
    ("--cb-timeout-duration-secs", "5"),
    ("--retry-max-retries", "8"),
    ("--retry-initial-backoff-ms", "100"),
    ("--retry-max-backoff-ms", "2000"),
    ("--health-check-interval-secs", "2"),
    ("--health-failure-threshold", "1"),
    ("--health-success-threshold", "1"),
    ("--worker-startup-timeout-secs", "86400"),
    ("--worker-startup-check-interval", "1"),
)
ROUTER_OWNED = {
    "--host": "qvl serve --host",
    "--port": "qvl serve --port",
    "--worker-urls": "qvl serve --workers / --devices (qvl starts the engines)",
    "--api-key": "qvl serve --api-key-file / $VLLM_API_KEY (never in argv)",
    "--prometheus-port": "nothing (qvl sets it: --port + replicas + 1 on loopback)",
    "--prometheus-host": "nothing (the router's metrics listen on loopback)",
    "--service-discovery": "qvl deploy (Kubernetes)",
    "--vllm-pd-disaggregation": "nothing (one replica serves prefill and decode)",
    "--prefill": "nothing (one replica serves prefill and decode)",
    "--decode": "nothing (one replica serves prefill and decode)",
    "--mini-lb": "nothing (the Rust router is the one qvl runs)",
}
ROUTER_INSTALL_HINT = "install it beside vLLM (`pip install vllm-router==0.1.17`; `make install` does)"


@dataclass
class FleetLaunch:
    """Every process of the fleet as data: the engines (one ``Launch`` each) and the router."""

    engines: list[Launch]
    router: Launch
    ports: list[int]
    devices: list[list[int]]
    checks: list[dict[str, Any]] = field(default_factory=list)
    emulated: bool = False
    batch: int = 1  # the compiled batch of one replica: the fleet holds len(engines) x batch at once
    front: Launch | None = None  # with a key or off loopback: qvl's guard on --host/--port (front_door.py)
    router_port: int = 0  # --port, or the loopback port behind the front door
    metrics_port: int = 0  # the router's own Prometheus metrics, on loopback

    @property
    def processes(self) -> list[tuple[str, Launch]]:
        named = [(f"engine-{i}", launch) for i, launch in enumerate(self.engines)] + [("router", self.router)]
        return named + ([("front-door", self.front)] if self.front is not None else [])

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.processes]

    def to_dict(self) -> dict[str, Any]:
        return {
            "processes": [
                {"name": n, "argv": p.to_dict()["argv"], "env": p.to_dict()["env"]} for n, p in self.processes
            ],
            "checks": list(self.checks),
            "engines": [
                {"name": f"engine-{i}", "port": port, "npus": devs, "url": f"http://{ENGINE_HOST}:{port}"}
                for i, (port, devs) in enumerate(zip(self.ports, self.devices, strict=True))
            ],
            "capacity": len(self.engines) * self.batch,
            "router": {
                "url": f"http://{ENGINE_HOST if self.front is not None else self.router.argv[2]}:{self.router_port}",
                "metrics": f"http://{ENGINE_HOST}:{self.metrics_port}/metrics",
            },
        }


def replicas_wanted(workers: int | None, devices: list[int] | None) -> bool:
    """Whether the flags ask for a fleet at all (``--workers 1`` alone is today's one engine); ``--workers 0`` or
    less is refused, never read as one engine."""
    if workers is not None and workers < 1:
        raise InputError(f"--workers {workers} must be at least 1", "e.g. --workers 4 (one engine per NPU)")
    return devices is not None or (workers is not None and workers > 1)


def check_npus_exist(ids: list[int], host_npus: int | None, flag: str) -> None:
    """Every NPU id the fleet would use is one the host has (``host_npus``: the emulated host's count under
    ``--emulate``); None when the count cannot be read here (nothing to check against)."""
    missing = [i for i in ids if host_npus is not None and i >= host_npus]
    if not missing:
        return
    have = f"NPUs 0-{host_npus - 1}" if host_npus > 1 else ("NPU 0" if host_npus == 1 else "no NPU")
    raise InputError(
        f"{flag}: this host has {host_npus} NPU{'s' if host_npus != 1 else ''} ({have}); NPU "
        f"{', '.join(map(str, missing))} {'is' if len(missing) == 1 else 'are'} not one of them; nothing was started",
        f"list ids from 0 to {host_npus - 1} (`rbln-smi` shows them; under --emulate QVL_EMULATOR_DEVICES sets the "
        "count, 4 by default)"
        if host_npus
        else "run on a host with NPUs",
    )


def replica_devices(
    visible: list[int], workers: int | None, devices: list[int] | None, host_npus: int | None = None
) -> list[list[int]]:
    """The NPUs of each replica: ``len(visible)`` each, from ``devices`` in order, else from 0 up; each one the
    host has."""
    per = len(visible)
    if workers is not None and workers < 1:
        raise InputError(f"--workers {workers} must be at least 1", "e.g. --workers 4 (one engine per NPU)")
    if devices is None:
        devices = list(range((workers or 1) * per))
        check_npus_exist(devices, host_npus, f"--workers {workers or 1} ({len(devices)} NPUs from 0 up)")
    check_npus_exist(devices, host_npus, f"--devices {','.join(map(str, devices))}")
    if len(devices) % per:
        raise InputError(
            f"--devices {','.join(map(str, devices))} lists {len(devices)} NPUs, but one replica of this artifact uses "
            f"{per} (its compiled placement: LM and ViT on NPUs {visible})",
            f"list a multiple of {per} NPUs",
        )
    groups = [devices[i : i + per] for i in range(0, len(devices), per)]
    if workers is not None and workers != len(groups):
        raise InputError(
            f"--workers {workers} and --devices {','.join(map(str, devices))} disagree: the devices hold "
            f"{len(groups)} replica(s) of {per} NPU(s)",
            "pass one of them (--devices decides the NPUs, --workers alone takes NPUs from 0 up)",
        )
    return groups


def _remapped(where: dict[str, Any], group: list[int]) -> dict[str, Any]:
    """The compiled placement moved onto ``group``: the same positions, the physical ids of this replica."""
    moved = dict(zip(where["visible"], group, strict=True))

    def ids(value: Any) -> Any:
        return [moved[i] for i in value] if isinstance(value, list) else moved[value]

    return {
        **where,
        "device": ids(where["device"]),
        "visual_device": ids(where["visual_device"]),
        "visible": list(group),
        "source": f"{where['source']}, moved to this replica's NPUs",
    }


def router_args(text: str | None) -> list[str]:
    """``--router-args '...'`` split as a shell would; the flags qvl sets are refused."""
    words = shlex.split(text or "")
    for flag, value, _, _ in parse_flags(words):
        base = flag.replace("_", "-").split("=", 1)[0]
        if base in ROUTER_OWNED:
            raise InputError(
                f"--router-args: `{flag}{'' if value is None else ' ' + value}` is set by qvl; nothing was started",
                f"use {ROUTER_OWNED[base]} instead",
            )
    return words


def fleet_command(
    opts: ServeOptions,
    environ: Mapping[str, str],
    *,
    workers: int | None,
    devices: list[int] | None,
    router_extra: str | None = None,
    emulator_env: Mapping[str, str] | None = None,
    host_npus: int | None = None,
) -> tuple[FleetLaunch, list[str]]:
    """The preflight once, then one ``vllm serve`` line per replica and ``vllm-router`` in front of them.
    ``emulator_env``: under ``--emulate``, the emulator's environment (composed in by the command, as for one
    engine: serving never reaches into a backend); ``host_npus``: the NPUs the host has (None: unknown here)."""
    if opts.device is not None or opts.visual_device is not None:
        raise InputError(
            "--device/--visual-device place one engine; --workers/--devices place a fleet",
            "pass --devices (each replica takes the compiled placement's number of NPUs from it, in order)",
        )
    extra_router = router_args(router_extra)
    check = check_serve(opts)  # the version, the host, the directory and the artifact, read and checked once
    art, plan, engine = check.art, check.plan, check.engine
    base = placement(art, None, None, getattr(plan, "placement", None), opts.force)
    groups = replica_devices(base["visible"], workers, devices, host_npus)
    ports = [opts.port + 1 + i for i in range(len(groups))]
    metrics_port = opts.port + len(groups) + 1
    engines, warnings = [], []
    for group, port in zip(groups, ports, strict=True):
        one = dataclasses.replace(opts, host=ENGINE_HOST, port=port)
        _, launch, said = replica_launch(check, one, environ, remap=lambda where, group=group: _remapped(where, group))
        _quiet(launch, opts.extra)
        engines.append(launch)
        warnings = warnings or said  # every replica says the same: the first one's lines
    checks = list(engines[0].checks)
    ok(
        checks,
        "fleet",
        f"{len(groups)} engine{'s' if len(groups) > 1 else ''}, one per replica's NPUs "
        f"({'; '.join(','.join(map(str, g)) for g in groups)}), on {ENGINE_HOST} "
        f"{f'ports {ports[0]}-{ports[-1]}' if len(ports) > 1 else f'port {ports[0]}'} "
        f"(loopback only), each with {engine.device_env} set to its own NPUs; vllm-router on "
        f"{host_port(opts.host, opts.port)} in front; the artifact was checked once",
    )
    router = Launch(argv=_router_argv(opts, ports, metrics_port, extra_router), env={}, checks=[])
    given = _policy(router.argv, extra_router)
    ok(
        checks,
        "router",
        f"vllm-router, policy {given or _policy_line(len(groups))}; qvl starts it once every engine answers /health "
        "(it would listen once one does) and says when the fleet is ready; its /health answers 200 only while every "
        "engine is healthy (/readiness: while one is)",
    )
    ok(
        checks,
        "metrics",
        f"the router's own on http://{ENGINE_HOST}:{metrics_port}/metrics (requests and health per engine); each "
        f"engine's vLLM metrics on its own port: {', '.join(f'http://{ENGINE_HOST}:{p}/metrics' for p in ports)}; "
        f"each engine leaves {', '.join(QUIET)} (the probes) out of its access log",
    )
    fleet = FleetLaunch(engines, router, ports, groups, checks, batch=art.cfg["batch_size"])
    fleet.router_port, fleet.metrics_port = opts.port, metrics_port
    _fleet_auth(fleet, opts, environ, warnings)
    top = max(metrics_port, fleet.router_port)  # behind a front door the router takes the port above the metrics
    if top > 65535:
        raise InputError(
            f"--port {opts.port}: the fleet takes the {top - opts.port} ports above it (its engines, the router's "
            f"metrics{', the router behind the front door' if fleet.front is not None else ''}), up to 65535",
            "pass a lower --port",
        )
    if opts.emulate:
        for launch in fleet.engines:
            emulated.apply(launch, emulator_env or {}, serve=True)
        fleet.emulated = True
    return fleet, warnings


def _policy_line(replicas: int) -> str:
    if replicas == 1:
        return f"{ONE_REPLICA_POLICY} (one engine: vllm-router refuses {POLICY} with fewer than two)"
    return f"{POLICY} (the less loaded of two engines)"


def _policy(argv: list[str], extra: list[str]) -> str | None:
    """The user's ``--policy`` (``'... (yours)'``) or None; a policy that needs two engines with one is refused."""
    given = [value for flag, value, _, _ in parse_flags(extra) if flag == "--policy"]
    if not given:
        return None
    policy = given[-1]
    workers = argv[argv.index("--worker-urls") + 1 : argv.index("--prometheus-host")]
    if len(workers) < 2 and policy in NEEDS_TWO:
        raise InputError(
            f"--router-args: --policy {policy} needs at least two engines and this fleet has one; nothing was started",
            f"drop it (one engine runs {ONE_REPLICA_POLICY}), or list more NPUs in --devices",
        )
    return f"{policy} (yours)"


def _router_argv(opts: ServeOptions, ports: list[int], metrics_port: int, extra: list[str]) -> list[str]:
    argv = [ROUTER, "--host", opts.host, "--port", str(opts.port), "--worker-urls"]
    argv += [f"http://{ENGINE_HOST}:{p}" for p in ports]
    argv += ["--prometheus-host", ENGINE_HOST, "--prometheus-port", str(metrics_port)]
    given = {flag for flag, _, _, _ in parse_flags(extra)}
    if "--policy" not in given:
        argv += ["--policy", POLICY if len(ports) > 1 else ONE_REPLICA_POLICY]
    for flag, value in ROUTER_DEFAULTS:
        if flag not in given:
            argv += [flag, value]
    return argv + extra


def _quiet(launch: Launch, extra: list[str]) -> None:
    """The probes out of the engine's access log, unless the user's ``-- ...`` says how to log."""
    said = {word.split("=", 1)[0] for word in extra}
    if not said & {"--disable-access-log-for-endpoints", "--disable-uvicorn-access-log", "--log-config-file"}:
        launch.argv += ["--disable-access-log-for-endpoints", ",".join(QUIET)]


def _fleet_auth(fleet: FleetLaunch, opts: ServeOptions, environ: Mapping[str, str], warnings: list[str]) -> None:
    """Who may call the fleet. vllm-router 0.1.17 checks no client key, answers its own routes, ``/add_worker`` and
    ``/remove_worker`` among them, to anyone, and passes the client's key on only for the routes it balances: with a
    key, or off loopback, qvl's guard (``front_door.py``) takes ``--host``/``--port`` and the router moves to
    loopback behind it."""
    key, source = api_key(opts.api_key_file, environ)
    where = host_port(opts.host, opts.port)
    if key is not None:
        for launch in fleet.engines:
            launch.env[API_KEY_ENV] = key
            launch.secret = frozenset({*launch.secret, API_KEY_ENV})
    if is_loopback(opts.host) and key is None:
        ok(fleet.checks, "auth", f"no API key; {where} listens on loopback only (this machine's users can call it)")
        return
    if key is None and not opts.no_auth:
        raise InputError(
            f"--host {opts.host} serves the fleet's OpenAI API ({where}/v1) to every machine that can reach this "
            "port, and no API key is set",
            f"export {API_KEY_ENV}=KEY or pass --api-key-file FILE, or --no-auth to serve it to anyone, or --host "
            "127.0.0.1",
        )
    if key is None:
        line = (
            f"--no-auth: the fleet on {where} answers every machine that can reach this port, without a key "
            "(the router's own routes that change where requests go stay closed)"
        )
        warn(fleet.checks, "auth", line)
        warnings.append(line)
    from qwenvl_rbln.serving import front_door

    front_door.put_in_front(fleet, opts, key, source)
