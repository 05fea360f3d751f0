"""Which vllm-rbln the command is for, and the placement flag and device variable of its generation.

Two generations take the NPU placement differently (facts: ``shared/engine/README.md``, audit 2026-12-04 finding 19):

* **0.11** (v0.11.x; checked end to end: vllm-rbln v0.11.1a1 on vLLM 0.22.0 over qvl's emulated rebel, the engine
  tests): ``--additional-config '{"rbln_config": {"device": D, "visual": {"device": V}}}'``
  (``vllm_rbln/model_executor/models/optimum/model_base.py``: ``additional_config["rbln_config"]`` becomes
  optimum-rbln's ``rbln_config``) and ``RBLN_DEVICES`` (``platform.py:73``, ``device_control_env_var``). It has no
  ``--rbln-optimum-overrides``: vLLM exits with "unrecognized arguments".
* **0.12** and later (read from its source, not run here: no public release of it installs on these machines):
  ``--rbln-optimum-overrides '{"device": D, "visual": {"device": V}}'`` and ``RBLN_VISIBLE_DEVICES``
  (``vllm_rbln/platform/__init__.py``: ``device_control_env_var``; ``RBLN_DEVICES`` is folded into it with a
  deprecation warning, and the runtime prefers ``RBLN_DEVICES`` when both are set, so qvl unsets it).

Where the line runs decides the version: the installed vllm-rbln (its distribution version, read without importing
it) for ``qvl serve``; ``--vllm-rbln VERSION`` where nothing is installed or the command is for another host
(``--dry-run`` on a laptop, ``qvl deploy``); else ``DEFAULT``, which every check line names. ``DEFAULT`` is the 0.11
line on purpose: it is the generation checked end to end, and the 0.12 line still accepts both its flag and its
variable (deprecated), so an image of either generation starts with it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from qwenvl_rbln.errors import InputError

DISTRIBUTION = "vllm-rbln"
DEFAULT = "0.11.1a1"  # the newest vllm-rbln whose whole source is public: shared/engine/vllm-rbln-0.11.1a1.tar.gz
OLDEST = (0, 11)
OVERRIDES_FROM = (0, 12)  # the first generation with --rbln-optimum-overrides and RBLN_VISIBLE_DEVICES
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.\d+)?[0-9A-Za-z.+-]*")


@dataclass(frozen=True)
class Engine:
    """The vllm-rbln a serve line is for: its version, where that came from, and its generation's spelling."""

    version: str
    source: str  # "installed", "--vllm-rbln", "default"

    @property
    def generation(self) -> str:
        return "0.12" if parse(self.version, "vllm-rbln") >= OVERRIDES_FROM else "0.11"

    @property
    def device_env(self) -> str:
        """The variable that picks the NPUs this vllm-rbln's processes see (numbered from 0 inside them)."""
        return "RBLN_VISIBLE_DEVICES" if self.generation == "0.12" else "RBLN_DEVICES"

    @property
    def other_device_env(self) -> str:
        """The other generation's name for it: unset, so an inherited value never picks other NPUs."""
        return "RBLN_DEVICES" if self.generation == "0.12" else "RBLN_VISIBLE_DEVICES"

    @property
    def placement_flag(self) -> str:
        return "--rbln-optimum-overrides" if self.generation == "0.12" else "--additional-config"

    def placement_args(self, overrides: dict[str, Any]) -> list[str]:
        """The placement as this generation's flag and JSON value."""
        value = overrides if self.generation == "0.12" else {"rbln_config": overrides}
        return [self.placement_flag, json.dumps(value)]

    def describe(self) -> str:
        where = {
            "installed": "installed here",
            "--vllm-rbln": "chosen with --vllm-rbln",
            "default": f"no vllm-rbln installed here: the default {DEFAULT}; --vllm-rbln VERSION picks another",
        }[self.source]
        return (
            f"vllm-rbln {self.version} ({where}): the {self.generation} line, placement through "
            f"{self.placement_flag} and devices through {self.device_env}"
        )


def parse(version: str, flag: str = "--vllm-rbln") -> tuple[int, int]:
    """(major, minor) of a vllm-rbln version; InputError naming ``flag`` when it is not one."""
    m = _VERSION.fullmatch(str(version).strip())
    if not m:
        raise InputError(
            f"{flag} {version!r} is not a vllm-rbln version",
            f"pass a version such as {flag} {DEFAULT} or {flag} 0.12.0",
        )
    return int(m.group(1)), int(m.group(2))


def installed_version() -> str | None:
    """The installed vllm-rbln's version from its distribution metadata (no import of vllm); None without one."""
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def resolve(requested: str | None, *, look_here: bool = True) -> Engine:
    """The vllm-rbln the line is for: ``requested`` (--vllm-rbln), else the installed one (``look_here``), else
    ``DEFAULT``. A version older than the oldest generation qvl knows is refused."""
    if requested is not None:
        engine = Engine(str(requested).strip(), "--vllm-rbln")
    else:
        found = installed_version() if look_here else None
        engine = Engine(found, "installed") if found else Engine(DEFAULT, "default")
    flag = "--vllm-rbln" if engine.source == "--vllm-rbln" else "the installed vllm-rbln"
    if parse(engine.version, flag) < OLDEST:
        raise InputError(
            f"{flag} {engine.version}: qvl builds serve lines for vllm-rbln 0.11 and later (older releases take "
            "neither placement flag qvl knows)",
            f"install vllm-rbln {DEFAULT} or later, or pass --vllm-rbln {DEFAULT} for another host",
        )
    return engine


def check_runnable(engine: Engine) -> None:
    """Before exec: a line chosen with --vllm-rbln must be the installed generation's, or vLLM refuses its flags."""
    found = installed_version()
    if engine.source != "--vllm-rbln" or found is None:
        return
    here = Engine(found, "installed")
    if here.generation != engine.generation:
        raise InputError(
            f"--vllm-rbln {engine.version} builds the {engine.generation} line ({engine.placement_flag}), but the "
            f"installed vllm-rbln {found} takes the {here.generation} line ({here.placement_flag}); nothing was "
            "started",
            "drop --vllm-rbln (serve reads the installed one), or keep it with --dry-run to print the line for "
            "another host",
        )
