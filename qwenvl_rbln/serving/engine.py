"""Which vllm-rbln the command is for, and the placement flag and device variable of its generation.

Two generations take the NPU placement differently (facts: ``shared/engine/README.md``, audits 2026-12-04 finding 19
and 2026-12-04b F7):

* **the 0.11 line** (v0.11.0a10 to v0.11.1a1 read tag by tag; checked end to end: vllm-rbln v0.11.1a1 on vLLM
  0.22.0 over qvl's emulated rebel, the engine tests): ``--additional-config '{"rbln_config": {"device": D, "visual":
  {"device": V}}}'`` (``vllm_rbln/model_executor/models/optimum/model_base.py``: ``additional_config["rbln_config"]``
  becomes optimum-rbln's ``rbln_config``) and ``RBLN_DEVICES`` (``platform.py:73``, ``device_control_env_var``). It
  has no ``--rbln-optimum-overrides``: vLLM exits with "unrecognized arguments".
* **the 0.12 line** (read from its public source, not run here: no such release installs on these machines):
  ``--rbln-optimum-overrides '{"device": D, "visual": {"device": V}}'`` (generated from ``OptimumRBLNConfig``'s field
  ``optimum_overrides``, ``vllm_rbln/config.py``) and ``RBLN_VISIBLE_DEVICES`` (``vllm_rbln/platform/__init__.py``:
  ``device_control_env_var``; ``RBLN_DEVICES`` is folded into it with a deprecation warning, and the runtime prefers
  ``RBLN_DEVICES`` when both are set, so qvl unsets it). Both arrived within the 0.11.x pre-releases, not at 0.12:
  the source schedules the old ``rbln_config`` key's removal "in 0.12.0", and a public testbed note has vllm-rbln
  0.11.3a20 folding ``RBLN_DEVICES`` in.

What decides, for an installed vllm-rbln (``qvl serve``): what it accepts, read from its own files without importing
it (``installed_line``: the 0.12 line when its source has both ``optimum_overrides`` and ``"RBLN_VISIBLE_DEVICES"``).
For a version alone (``--vllm-rbln VERSION`` for another host, ``qvl deploy``, a package whose files cannot be read):
the version, PEP 440 ordered, against ``OVERRIDES_FROM`` (0.11.3a20 and its dev builds, the first release the sources
place the new spelling in; a version between 0.11.1a1 and it gets the 0.11 line, which the 0.12 line still takes
through its deprecated aliases). Without either: ``DEFAULT``, which every check line names, the 0.11 line checked
end to end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from qwenvl_rbln.errors import InputError

DISTRIBUTION = "vllm-rbln"
DEFAULT = "0.11.1a1"  # the newest vllm-rbln whose whole source is public: shared/engine/vllm-rbln-0.11.1a1.tar.gz
OLDEST = (0, 11)
# the first release the sources place --rbln-optimum-overrides + RBLN_VISIBLE_DEVICES in, its development builds
# included (the public testbed note ran 0.11.3a20.dev1 with it)
OVERRIDES_FROM = "0.11.3a20.dev0"
# what the 0.12 line's source has and the 0.11 line's lacks (the flag's config field; the new device variable)
MARKERS = ("optimum_overrides", '"RBLN_VISIBLE_DEVICES"')


@dataclass(frozen=True)
class Engine:
    """The vllm-rbln a serve line is for: its version, where that came from, and its generation's spelling."""

    version: str
    source: str  # "installed", "--vllm-rbln", "default"
    accepts_overrides: bool | None = None  # read from the installed package's files; None: decided by the version

    @property
    def generation(self) -> str:
        if self.accepts_overrides is not None:
            return "0.12" if self.accepts_overrides else "0.11"
        return "0.12" if version_of(self.version, "vllm-rbln") >= version_of(OVERRIDES_FROM) else "0.11"

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
        if self.accepts_overrides is not None:
            have = "have" if self.accepts_overrides else "lack"
            how = f"its files {have} --rbln-optimum-overrides' field and RBLN_VISIBLE_DEVICES"
        else:
            how = f"by its version: the 0.12 line from {OVERRIDES_FROM}"
        return (
            f"vllm-rbln {self.version} ({where}): the {self.generation} line ({how}), placement through "
            f"{self.placement_flag} and devices through {self.device_env}"
        )


def version_of(version: str, flag: str = "--vllm-rbln") -> Any:
    """A vllm-rbln version as PEP 440 orders it (``packaging``); InputError naming ``flag`` when ``version`` is not
    one as a whole (no leading ``v``, nothing around it)."""
    from packaging.version import InvalidVersion, Version

    text = str(version).strip()
    try:
        if not text[:1].isdigit():
            raise InvalidVersion(text)
        found = Version(text)
    except InvalidVersion:
        raise InputError(
            f"{flag} {version!r} is not a vllm-rbln version",
            f"pass a version such as {flag} {DEFAULT} or {flag} 0.12.0",
        ) from None
    return found


def parse(version: str, flag: str = "--vllm-rbln") -> tuple[int, int]:
    """(major, minor) of a vllm-rbln version; InputError naming ``flag`` when it is not one."""
    release = version_of(version, flag).release
    return release[0], (release[1] if len(release) > 1 else 0)


def installed_line() -> bool | None:
    """Whether the installed vllm-rbln takes the 0.12 line, read from its files without importing it: True when its
    Python source has every one of ``MARKERS``, False when it has not; None without a readable installed package."""
    from importlib import metadata

    try:
        files = metadata.distribution(DISTRIBUTION).files or []
    except metadata.PackageNotFoundError:
        return None
    found: set[str] = set()
    read = 0
    for path in files:
        if path.suffix != ".py" or path.parts[:1] != ("vllm_rbln",):
            continue
        try:
            text = path.locate().read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        read += 1
        found.update(m for m in MARKERS if m in text)
    return None if read == 0 else found == set(MARKERS)


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
        engine = Engine(found, "installed", installed_line()) if found else Engine(DEFAULT, "default")
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
    here = Engine(found, "installed", installed_line())
    if here.generation != engine.generation:
        raise InputError(
            f"--vllm-rbln {engine.version} builds the {engine.generation} line ({engine.placement_flag}), but the "
            f"installed vllm-rbln {found} takes the {here.generation} line ({here.placement_flag}); nothing was "
            "started",
            "drop --vllm-rbln (serve reads the installed one), or keep it with --dry-run to print the line for "
            "another host",
        )
