"""What tune hands over: the tuned preset (YAML, loadable with ``--preset``), the exact compile and serve commands,
and the vLLM flags ``qvl serve`` will pass once the artifact exists.

The preset is written whole (no ``extends``), so it still means the same thing if the shipped presets change.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from qwenvl_rbln.planning.presets import load_preset


def preset_data(base: str, sets: list[str], description: str, output_dir: str, model: str | None) -> dict[str, Any]:
    """The base preset with the configuration's --sets applied, as one self-contained mapping."""
    loaded = load_preset(base, sets)
    data = copy.deepcopy(loaded.data)
    data.pop("extends", None)
    out: dict[str, Any] = {"description": description}
    for key in ("backend", "model", "npu"):
        out[key] = data.get(key)
    if model is not None:
        out["model"] = model
    out["output_dir"] = output_dir
    for key in ("rbln_config", "placement", "processor", "runtime"):
        if data.get(key):
            out[key] = data[key]
    return out


def preset_yaml(data: dict[str, Any], header: list[str]) -> str:
    import yaml

    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=1000, allow_unicode=True)
    return "".join(f"# {line}\n" for line in header) + body


def output_dir_for(path: Path | None) -> str:
    return f"qvl-out/{path.stem if path is not None else 'tuned'}"


def commands(preset_ref: str, data: dict[str, Any], plan: Any) -> dict[str, Any]:
    """``qvl compile``, ``qvl serve`` and the vLLM command serve will build for the tuned preset ``data`` (its
    ``plan``), from the one builder serve runs (``serving.command.vllm_launch``), so the printed line and
    ``qvl serve --dry-run`` cannot differ."""
    from qwenvl_rbln.serving.command import placement, plan_artifact, vllm_launch

    art = plan_artifact(plan, data["output_dir"])
    launch = vllm_launch(art, plan, placement(art, None, None, None))
    return {
        "compile": f"qvl compile --preset {preset_ref}",
        "dry_run": f"qvl compile --preset {preset_ref} --dry-run",
        "serve": f"qvl serve {data['output_dir']}",
        "vllm": launch.argv,
        "env": {k: v for k, v in launch.env.items() if v is not None},  # exactly what qvl serve sets
    }


def check_output(path: Path, *, force: bool = False) -> Path:
    """-o names a .yaml file (what --preset reads) in a folder that exists, and replaces only a preset tune wrote
    unless --force: checked before the search runs, so a bad path costs nothing and no user file is lost."""
    from qwenvl_rbln.errors import InputError
    from qwenvl_rbln.paths import user_path

    target = user_path(path, "-o preset file")
    if target.is_dir():
        raise InputError(f"-o {path} is a directory", "give a file name, e.g. -o tuned.yaml")
    if target.suffix not in (".yaml", ".yml"):
        raise InputError(f"-o {path} does not end in .yaml", "name the preset e.g. tuned.yaml (--preset reads .yaml)")
    parent = target.parent
    for folder in (parent, *parent.parents):  # the nearest part of the path that exists says what is wrong
        if folder.exists():
            if not folder.is_dir():
                raise InputError(f"-o {path}: {folder} is a file, not a folder", "give a path inside a folder")
            break
    if not parent.is_dir():
        raise InputError(f"-o {path}: the folder {parent} does not exist", f"create it first (mkdir -p {parent})")
    if target.exists() and not force and not _written_by_tune(target):
        raise InputError(
            f"-o {path} exists and was not written by qvl tune (its first line is not '# {HEADER}')",
            "choose another file name, or pass --force to replace it",
        )
    return target


def write_preset(path: Path, text: str, *, force: bool = False) -> bool:
    """Write the preset whole or not at all: a temporary file beside it, then a rename. The file gets the
    permissions any new file gets under the umask (mkstemp makes 0600). Returns True when it replaced a file."""
    import os
    import tempfile

    from qwenvl_rbln.errors import InputError

    target = check_output(path, force=force)
    replaced = target.exists()
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except OSError as exc:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        raise InputError(
            f"-o {path}: cannot write the preset ({exc.strerror or exc})", "choose a writable path"
        ) from None
    return replaced


HEADER = "Written by `qvl tune`."  # the first line of every preset tune writes: what -o may replace without --force


def _written_by_tune(target: Path) -> bool:
    try:
        with target.open(encoding="utf-8", errors="replace") as f:
            return f.readline().startswith(f"# {HEADER}")
    except OSError:
        return False
