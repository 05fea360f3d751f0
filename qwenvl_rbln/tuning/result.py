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


def commands(preset_ref: str, data: dict[str, Any], max_len: int, batch: int) -> dict[str, Any]:
    """``qvl compile``, ``qvl serve`` and the vLLM command serve will build, from the one builder serve runs
    (``serving.command.vllm_launch``), so the printed line and ``qvl serve --dry-run`` cannot differ."""
    from qwenvl_rbln.planning.plan import plan_from_loaded
    from qwenvl_rbln.planning.presets import LoadedPreset
    from qwenvl_rbln.serving.command import placement, plan_artifact, vllm_launch

    plan = plan_from_loaded(LoadedPreset(name="tuned", path=Path("tuned.yaml"), data=data), model=data.get("model"))
    art = plan_artifact(plan, data["output_dir"])
    launch = vllm_launch(art, plan, placement(art, None, None, None))
    return {
        "compile": f"qvl compile --preset {preset_ref}",
        "dry_run": f"qvl compile --preset {preset_ref} --dry-run",
        "serve": f"qvl serve {data['output_dir']}",
        "vllm": launch.argv,
        "env": {k: v for k, v in launch.env.items() if v is not None},  # exactly what qvl serve sets
    }


def check_output(path: Path) -> Path:
    """-o names a .yaml file (what --preset reads), checked before the search runs."""
    from qwenvl_rbln.errors import InputError
    from qwenvl_rbln.paths import user_path

    target = user_path(path, "-o preset file")
    if target.is_dir():
        raise InputError(f"-o {path} is a directory", "give a file name, e.g. -o tuned.yaml")
    if target.suffix not in (".yaml", ".yml"):
        raise InputError(f"-o {path} does not end in .yaml", "name the preset e.g. tuned.yaml (--preset reads .yaml)")
    return target


def write_preset(path: Path, text: str) -> None:
    """Write the preset whole or not at all: a temporary file beside it, then a rename."""
    import os
    import tempfile

    from qwenvl_rbln.errors import InputError

    target = check_output(path)
    parent = target.parent if str(target.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    except OSError as exc:
        raise InputError(
            f"-o {path}: cannot write the preset ({exc.strerror or exc})", "choose a writable path"
        ) from None
