"""What ``qvl serve`` / ``qvl bench-serve`` take and give: their options, the checked artifact, the launch as data.

The names vLLM and the packing plugin agree on (entry point, environment variable) and the defaults live here too,
so every other serving module, the command and the tests share one spelling of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.serving.engine import Engine
from qwenvl_rbln.serving.engine import resolve as resolve_engine

if TYPE_CHECKING:
    from qwenvl_rbln.artifacts.checked import CheckedArtifact
    from qwenvl_rbln.serving.engine import Engine

PLUGIN_NAME = "qvl_vit_packing"  # the vllm.general_plugins entry point (pyproject.toml)
PLUGIN_GROUP = "vllm.general_plugins"
PACKING_ENV = "QVL_VIT_PACKING"  # "1": the plugin installs the packed ViT forward in every vLLM process
FRAME_CAP_ENV = "QVL_FRAME_CAP"  # "1": the plugin caps each video frame at the artifact's qvl_max_frame_pixels
# pixels per frame for a video processor whose config has no (or a larger) qvl_max_frame_pixels: an artifact saved
# outside qvl keeps the checkpoint's processor files, so serve hands the cap over here instead of editing them
MAX_FRAME_PIXELS_ENV = "QVL_MAX_FRAME_PIXELS"
API_KEY_ENV = "VLLM_API_KEY"  # vLLM's OpenAI server requires this key when set; never passed in argv
# the ASGI middleware on every serve line: with a key, every route but public_routes.PUBLIC_ROUTES requires it
KEY_GUARD = "qwenvl_rbln.serving.key_guard.KeyGuard"
BENCH_KEY_ENV = "OPENAI_API_KEY"  # what `vllm bench serve` sends as "Authorization: Bearer ..."
USAGE_STATS_ENV = "VLLM_NO_USAGE_STATS"  # vLLM reports usage to its authors by default: off in every line qvl builds
DO_NOT_TRACK_ENVS = ("DO_NOT_TRACK", "VLLM_DO_NOT_TRACK")  # the other opt-outs vLLM reads (vllm/envs.py)
_OPT_IN = ("0", "false", "no", "off")
REDACTED = "<redacted>"
DEFAULT_HOST = "127.0.0.1"  # local only unless asked: `--host 0.0.0.0` serves other machines
DEFAULT_PORT = 8000  # vLLM's own default


def usage_stats_opted_in(environ: Mapping[str, str]) -> bool:
    """Whether the user explicitly allowed vLLM's usage statistics: at least one of ``VLLM_NO_USAGE_STATS``,
    ``DO_NOT_TRACK``, ``VLLM_DO_NOT_TRACK`` set to 0 (or false, no, off) and none set to anything else. Every other
    case gets ``VLLM_NO_USAGE_STATS=1``: vLLM reads only the value "1" as an opt-out (``vllm/envs.py``), so a
    ``DO_NOT_TRACK=true`` or an empty one, which a user means as "do not track", would otherwise leave them on
    (audit 2026-12-04b F2)."""
    said = [environ[name].strip().lower() for name in (USAGE_STATS_ENV, *DO_NOT_TRACK_ENVS) if name in environ]
    return bool(said) and all(value in _OPT_IN for value in said)


@dataclass
class Launch:
    """What to run: ``argv`` exactly, with ``env`` set (a None value unsets it) on top of the inherited environment."""

    argv: list[str]
    env: dict[str, str | None]
    checks: list[dict[str, Any]]
    secret: frozenset[str] = frozenset()  # env keys whose values are never shown (--dry-run, --json)
    engine: Engine | None = None  # the vllm-rbln the line is for (``vllm serve`` lines; None for the benchmark)
    emulated: bool = False  # --emulate: qvl runs it as a labelled child (supervise.py), never execs it
    engine: Engine | None = None  # the vllm-rbln the line is for (engine.resolve), checked again before exec

    @property
    def device_env(self) -> str:
        """The variable that picks the NPUs: the line's vllm-rbln generation's (``Engine.device_env``)."""
        return (self.engine or resolve_engine(None, look_here=False)).device_env

    def to_dict(self) -> dict[str, Any]:
        """What --dry-run shows: the env with every secret value replaced by ``REDACTED``."""
        env = {k: (REDACTED if k in self.secret and v is not None else v) for k, v in self.env.items()}
        return {"argv": list(self.argv), "env": env, "checks": list(self.checks)}

    def exec_env(self, inherited: Mapping[str, str]) -> dict[str, str]:
        out = dict(inherited)
        for key, value in self.env.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = value
        return out


@dataclass
class Artifact:
    """A compiled artifact that passed the preflight."""

    root: Path
    cfg: dict[str, Any]
    manifest: dict[str, Any] | None
    model_config: dict[str, Any]
    checks: list[dict[str, Any]] = field(default_factory=list)
    # what the processor files let through (preflight): {"image": bool, "video": bool, "min_pixels", "why", "cap"};
    # a True kind is capped by serve (images per request, video frames through the plugin), the files untouched
    processor_fix: dict[str, Any] = field(default_factory=dict)
    # the files as the preflight read them, once (None for ``plan_artifact``'s artifact, which has no files)
    checked: CheckedArtifact | None = None

    @property
    def target(self) -> dict[str, Any]:
        """The NPU and num_devices the graphs were compiled for (``layout.compile_target``)."""
        if self.checked is not None:
            return self.checked.target
        from qwenvl_rbln.artifacts.layout import compile_target

        return compile_target(self.cfg, self.manifest)

    @property
    def buckets(self) -> list[int]:
        buckets = self.cfg["visual"]["max_seq_len"]
        return sorted([buckets] if isinstance(buckets, int) else buckets)

    @property
    def patch_size(self) -> int:
        value = (self.model_config.get("vision_config") or {}).get("patch_size", 16)
        return value if type(value) is int and value > 0 else 16

    @property
    def merge_size(self) -> int:
        value = (self.model_config.get("vision_config") or {}).get("spatial_merge_size", 2)
        return value if type(value) is int and value > 0 else 2

    @property
    def max_pixels(self) -> int:
        return self.buckets[-1] * self.patch_size**2


def _check_names(host: str, served_model_name: str | None) -> None:
    """An empty --host or --served-model-name is refused: vLLM would read '' as "every interface" or serve a
    model no client can name."""
    if not str(host).strip():
        raise InputError("--host is empty", f"pass an address, e.g. --host {DEFAULT_HOST} (or 0.0.0.0 for every one)")
    if served_model_name is not None and not served_model_name.strip():
        raise InputError(
            "--served-model-name is empty", "leave it out (the compiled model's hub id) or pass the name clients send"
        )


@dataclass
class ServeOptions:
    directory: Path | None = None
    preset: str | None = None
    device: Any = None
    visual_device: Any = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    served_model_name: str | None = None
    vit_packing: bool | None = None  # None: the manifest's / preset's runtime.vit_packing, else on
    extra: list[str] = field(default_factory=list)
    force: bool = False  # serve a num_devices > 1 artifact on a Rebel100 anyway
    api_key_file: Path | None = None  # else $VLLM_API_KEY; required off loopback unless no_auth
    no_auth: bool = False  # serve off loopback without a key, said out loud
    uncertain_ok: bool = False  # a remapped placement whose memory verdict is "uncertain" is served anyway
    emulate: bool = False  # an artifact from `qvl compile --emulate`, served on qvl's emulated NPU (loopback only)
    vllm_rbln: str | None = None  # the vllm-rbln version the line is for (default: the installed one, engine.py)
    engine_here: bool = True  # False for a line run elsewhere (qvl deploy): the local vllm-rbln does not count

    def __post_init__(self) -> None:
        _check_names(self.host, self.served_model_name)


@dataclass
class BenchOptions:
    directory: Path | None = None
    preset: str | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    served_model_name: str | None = None
    num_prompts: int = 100
    input_len: int = 128
    output_len: int = 128
    seed: int = 0
    extra: list[str] = field(default_factory=list)
    api_key_file: Path | None = None  # else $VLLM_API_KEY: sent as "Authorization: Bearer ..."
    emulate: bool = False  # benchmark a `qvl serve --emulate` server (its artifact compiled with --emulate)
    workers: int | None = None  # a fleet (`qvl serve --workers N`): concurrency is N x the compiled batch

    def __post_init__(self) -> None:
        _check_names(self.host, self.served_model_name)
        if self.workers is not None and self.workers < 1:
            raise InputError(f"--workers {self.workers} must be at least 1", "pass the fleet's engine count")


# ------------------------------------------------------------------------------------------------ who may call


def is_loopback(host: str) -> bool:
    """Only this machine can reach an address on the loopback interface (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name or an interface address: other machines may reach it


def host_port(host: str, port: int) -> str:
    """``HOST:PORT`` as a URL spells it: an IPv6 literal in brackets (``[::]:8000``, not ``:::8000``)."""
    import ipaddress

    name = host.strip()
    bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    try:
        v6 = ipaddress.ip_address(bare.partition("%")[0]).version == 6
    except ValueError:
        v6 = False
    return f"[{bare}]:{port}" if v6 else f"{name}:{port}"


def api_key(api_key_file: Path | None, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """The API key and where it came from: ``--api-key-file`` (first line), else ``$VLLM_API_KEY``; never argv, so
    a process list cannot show it."""
    if api_key_file is not None:
        from qwenvl_rbln.paths import user_path

        path = user_path(api_key_file, "--api-key-file")
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(
                f"--api-key-file {api_key_file}: cannot read it ({getattr(exc, 'strerror', None) or exc})",
                "pass a readable file whose first line is the key",
            ) from None
        key = lines[0].strip() if lines else ""
        if not key or any(c.isspace() for c in key):
            raise InputError(
                f"--api-key-file {api_key_file}: its first line is {'empty' if not key else 'not one word'}",
                "write the key alone on the first line (e.g. `openssl rand -hex 32 > FILE`)",
            )
        return key, f"--api-key-file {api_key_file}"
    key = (environ.get(API_KEY_ENV) or "").strip()
    return (key, f"${API_KEY_ENV}") if key else (None, "none")
