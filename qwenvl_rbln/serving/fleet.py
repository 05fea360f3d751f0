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
* Engines listen on loopback only (``127.0.0.1``, ports ``--port + 1`` and up); the router on ``--host``/``--port``.
* The router's policy is ``power_of_two`` (the less loaded of two engines, by the router's own count of requests
  in flight). A Qwen3-VL chat costs from a short text to several ViT buckets and a long prefill, and a replica's
  compiled batch is small (2-16), so the load must count at every request: ``round_robin``'s equal counts queue
  behind a long request (measured: the same throughput, a 31 % higher median TTFT), and ``cache_aware`` (the
  router's default) balances by load only once two engines are 64 requests apart, far beyond a Rebel100 batch.
  ``cache_aware`` measured the same as ``power_of_two`` on requests that share no prefix; for multi-turn chats that
  resend their images, ``--router-args '--policy cache_aware --balance-abs-threshold B'`` keeps a conversation on
  the engine holding its prefix (not measured here). ``benchmarks/bench_fleet.py``, figures in
  ``benchmarks/README.md``.
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
    REDACTED,
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
QUIET_ROUTES = "/get_load"
POLICY = "power_of_two"
# the router's health check every 2 s, one miss takes an engine out and one answer puts it back; it waits for
# every engine at start (an engine's first start may take many minutes: a long bound, qvl gives up before). A
# request that fails on an engine that just died is retried (the router picks again each time, and a dead engine's
# count of requests in flight is 0, so it may be picked again): 8 tries over about 5 s, longer than the health
# check takes to put the dead engine out of rotation (its default, 5 tries over 0.7 s, is shorter). Those failures
# open the engine's circuit breaker; the router tries it again after 5 s (not its default 60 s), so an engine qvl
# restarted is back in rotation as soon as its /health answers
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
    "--prometheus-port": "nothing (qvl sets it: --port + workers + 1 on loopback)",
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
    front: Launch | None = None  # off loopback with a key: qvl's key guard on --host/--port (front_door.py)

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
        }


def replicas_wanted(workers: int | None, devices: list[int] | None) -> bool:
    """Whether the flags ask for a fleet at all (``--workers 1`` alone is today's one engine)."""
    return devices is not None or (workers is not None and workers > 1)


def replica_devices(visible: list[int], workers: int | None, devices: list[int] | None) -> list[list[int]]:
    """The NPUs of each replica: ``len(visible)`` each, from ``devices`` in order, else from 0 up."""
    per = len(visible)
    if workers is not None and workers < 1:
        raise InputError(f"--workers {workers} must be at least 1", "e.g. --workers 4 (one engine per NPU)")
    if devices is None:
        devices = list(range((workers or 1) * per))
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
) -> tuple[FleetLaunch, list[str]]:
    """The preflight once, then one ``vllm serve`` line per replica and ``vllm-router`` in front of them.
    ``emulator_env``: under ``--emulate``, the emulator's environment (composed in by the command, as for one
    engine: serving never reaches into a backend)."""
    if opts.device is not None or opts.visual_device is not None:
        raise InputError(
            "--device/--visual-device place one engine; --workers/--devices place a fleet",
            "pass --devices (each replica takes the compiled placement's number of NPUs from it, in order)",
        )
    extra_router = router_args(router_extra)
    check = check_serve(opts)  # the version, the host, the directory and the artifact, read and checked once
    art, plan, engine = check.art, check.plan, check.engine
    base = placement(art, None, None, getattr(plan, "placement", None), opts.force)
    groups = replica_devices(base["visible"], workers, devices)
    ports = [opts.port + 1 + i for i in range(len(groups))]
    if opts.port + len(groups) + 1 > 65535:
        raise InputError(f"--port {opts.port}: the engines take the ports above it, up to 65535", "pass a lower --port")
    engines, warnings = [], []
    for group, port in zip(groups, ports, strict=True):
        one = dataclasses.replace(opts, host=ENGINE_HOST, port=port)
        _, launch, said = replica_launch(check, one, environ, remap=lambda where, group=group: _remapped(where, group))
        if not any(word.startswith("--disable-access-log-for-endpoints") for word in opts.extra):
            launch.argv += ["--disable-access-log-for-endpoints", QUIET_ROUTES]  # the router's polls, every 5 s
        engines.append(launch)
        warnings = warnings or said  # every replica says the same: the first one's lines
    checks = list(engines[0].checks)
    ok(
        checks,
        "fleet",
        f"{len(groups)} engines, one per replica's NPUs ({'; '.join(','.join(map(str, g)) for g in groups)}), "
        f"on {ENGINE_HOST} ports {ports[0]}-{ports[-1]} (loopback only), each with {engine.device_env} set to its "
        f"own NPUs; vllm-router on {host_port(opts.host, opts.port)} in front; the artifact was checked once",
    )
    metrics_port = opts.port + len(groups) + 1
    argv = [ROUTER, "--host", opts.host, "--port", str(opts.port), "--worker-urls"]
    argv += [f"http://{ENGINE_HOST}:{p}" for p in ports]
    argv += ["--prometheus-host", ENGINE_HOST, "--prometheus-port", str(metrics_port)]
    given = {flag.split("=", 1)[0].replace("_", "-") for flag, _, _, _ in parse_flags(extra_router)}
    if "--policy" not in given:
        argv += ["--policy", POLICY]
    for flag, value in ROUTER_DEFAULTS:
        if flag not in given:
            argv += [flag, value]
    argv += extra_router
    router = Launch(argv=argv, env={}, checks=[])
    ok(
        checks,
        "router",
        f"vllm-router, policy {'(yours)' if '--policy' in given else POLICY + ' (the less loaded of two engines)'}; "
        f"its /health answers 200 only while every engine is healthy (/readiness: while one is); it listens once "
        f"every engine answers /health; its own metrics on {ENGINE_HOST}:{metrics_port}",
    )
    fleet = FleetLaunch(engines, router, ports, groups, checks, batch=art.cfg["batch_size"])
    _fleet_auth(fleet, opts, environ, warnings)
    if opts.emulate:
        for launch in fleet.engines:
            emulated.apply(launch, emulator_env or {}, serve=True)
        fleet.emulated = True
    return fleet, warnings


def _fleet_auth(fleet: FleetLaunch, opts: ServeOptions, environ: Mapping[str, str], warnings: list[str]) -> None:
    """Who may call the fleet. vllm-router 0.1.17 checks no client key (its ``--api-key`` is what it sends to the
    engines) and answers its own routes, ``/add_worker`` and ``/remove_worker`` among them, to anyone: off
    loopback the router listens on loopback and qvl's key guard (``front_door.py``) takes ``--host``/``--port``."""
    key, source = api_key(opts.api_key_file, environ)
    where = host_port(opts.host, opts.port)
    if key is not None:
        for launch in fleet.engines:
            launch.env[API_KEY_ENV] = key
            launch.secret = frozenset({*launch.secret, API_KEY_ENV})
    if is_loopback(opts.host):
        detail = (
            f"API key from {source} ({REDACTED}): every engine requires it (the router passes the client's "
            "Authorization on)"
            if key is not None
            else "no API key"
        )
        ok(fleet.checks, "auth", f"{detail}; {where} listens on loopback only (this machine's users can call it)")
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
            f"--no-auth: the fleet on {where} answers every machine that can reach this port, without a key, "
            "the router's own routes too (/add_worker, /remove_worker: anyone can change where requests go)"
        )
        warn(fleet.checks, "auth", line)
        warnings.append(line)
        return
    from qwenvl_rbln.serving import front_door

    front_door.put_in_front(fleet, opts, key, source)
