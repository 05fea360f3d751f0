"""An emulated compiled graph: a static-shape aten graph traced from the module, stored without pickle.

Why a traced graph: an NPU graph is compiled for fixed input shapes, so every Python decision in
optimum-rbln's wrapper is taken once, at compile time. ``make_fx`` (real tensors) records exactly that: the
aten ops the module ran for the example shapes, with ``rbln_custom_ops`` left as opaque calls.

Why this file format: artifact directories are passed between people, so loading must never run code.
A graph file is a safetensors file: its tensors are the graph's constants (weights), its metadata holds
the graph as JSON (nodes whose targets are looked up by name in the ``aten``, ``prims`` and
``rbln_custom_ops`` namespaces only, plus ``operator.getitem``), the input specs, and a sha256 of both.
Anything else (another format, another writer, an edit) is refused before a tensor is read.
The marker (``FORMAT``, ``MARKER``) and the header reader live in ``qwenvl_rbln.artifacts.emulated``: whether
an artifact is emulated is asked there, by serving and the loaders alike.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
from pathlib import Path
from typing import Any

from qwenvl_rbln.artifacts.emulated import FORMAT, MARKER, read_metadata

FORMAT_VERSION = 1
ALLOWED_NAMESPACES = ("aten", "prims", "rbln_custom_ops")
DTYPES = (
    "float32",
    "float16",
    "bfloat16",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "bool",
    "float8_e4m3fn",
)


class GraphFileError(Exception):
    """A graph file the emulator will not load (foreign, tampered, or from another emulator format)."""


def torch_dtype(value: Any) -> Any:
    import torch

    if isinstance(value, torch.dtype):
        return value
    name = str(value).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"qvl emulator: unsupported dtype {value!r}")
    return getattr(torch, name)


def dtype_name(value: Any) -> str:
    return str(torch_dtype(value)).removeprefix("torch.")


# ------------------------------------------------------------------------------------------------ tracing


def trace(module: Any, inputs: list[Any]) -> Any:
    """The aten graph ``module(*inputs)`` runs (an fx GraphModule); constants are the module's tensors."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    def run(*args: Any) -> Any:
        return module(*args)

    with torch.inference_mode(False), torch.no_grad():
        args = [x.clone() if getattr(x, "is_inference", lambda: False)() else x for x in inputs]
        return make_fx(run, tracing_mode="real")(*args)


# ------------------------------------------------------------------------------------------ serialisation


def _enc(value: Any) -> Any:
    import torch
    import torch.fx

    if isinstance(value, torch.fx.Node):
        return {"n": value.name}
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"f": repr(value)}
    if isinstance(value, list | tuple):
        return {"l" if isinstance(value, list) else "t": [_enc(v) for v in value]}
    if isinstance(value, torch.dtype):
        return {"dtype": dtype_name(value)}
    if isinstance(value, torch.device):
        return {"device": "cpu"}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"mf": str(value).removeprefix("torch.")}
    raise ValueError(f"qvl emulator: cannot store a graph argument of type {type(value).__name__}")


def _target_name(target: Any) -> str:
    if target is operator.getitem:
        return "operator.getitem"
    schema = getattr(target, "_schema", None)
    if schema is None:
        raise ValueError(f"qvl emulator: the traced graph calls {target!r}, which is not an aten/custom op")
    return f"{schema.name}.{target._overloadname}"


def serialize(gm: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(graph JSON, constants) of a traced GraphModule; shared constants are stored once."""
    nodes = []
    constants: dict[str, Any] = {}
    for node in gm.graph.nodes:
        entry: dict[str, Any] = {"op": node.op, "name": node.name}
        if node.op == "get_attr":
            constants[node.target] = getattr(gm, node.target)
            entry["target"] = node.target
        elif node.op == "call_function":
            entry["target"] = _target_name(node.target)
            entry["args"] = _enc(node.args)
            entry["kwargs"] = {k: _enc(v) for k, v in node.kwargs.items()}
        elif node.op == "output":
            entry["args"] = _enc(node.args)
        elif node.op != "placeholder":
            raise ValueError(f"qvl emulator: unsupported graph node {node.op}")
        nodes.append(entry)
    return {"nodes": nodes}, constants


def _resolve(name: str) -> Any:
    import torch

    if name == "operator.getitem":
        return operator.getitem
    qual, _, overload = name.rpartition(".")
    ns, _, op = qual.partition("::")
    if ns not in ALLOWED_NAMESPACES or not op or not overload:
        raise GraphFileError(f"calls {name!r}, outside the allowed op namespaces {ALLOWED_NAMESPACES}")
    try:
        return getattr(getattr(getattr(torch.ops, ns), op), overload)
    except (AttributeError, RuntimeError) as exc:
        raise GraphFileError(f"calls an unknown op {name!r}") from exc


def _dec(value: Any, env: dict[str, Any]) -> Any:
    import torch

    if isinstance(value, list):
        raise GraphFileError("malformed graph argument")
    if not isinstance(value, dict):
        return value
    if "n" in value:
        return env[value["n"]]
    if "l" in value:
        return [_dec(v, env) for v in value["l"]]
    if "t" in value:
        return tuple(_dec(v, env) for v in value["t"])
    if "f" in value:
        return float(value["f"])
    if "dtype" in value:
        return torch_dtype(value["dtype"])
    if "device" in value:
        return torch.device("cpu")
    if "layout" in value and value["layout"] in ("strided", "sparse_coo"):
        return getattr(torch, value["layout"])
    if "mf" in value and value["mf"] in ("contiguous_format", "preserve_format", "channels_last"):
        return getattr(torch, value["mf"])
    raise GraphFileError(f"malformed graph argument {value!r}")


def build(graph_json: dict[str, Any], constants: dict[str, Any]) -> Any:
    """A runnable GraphModule from stored JSON; only allow-listed ops can appear in it."""
    import torch
    import torch.fx

    graph = torch.fx.Graph()
    env: dict[str, Any] = {}
    root = torch.nn.Module()
    try:
        for entry in graph_json["nodes"]:
            op, name = entry["op"], entry["name"]
            if op == "placeholder":
                env[name] = graph.placeholder(name)
            elif op == "get_attr":
                target = entry["target"]
                if not str(target).isidentifier() or target not in constants:
                    raise GraphFileError(f"refers to a missing constant {target!r}")
                root.register_buffer(target, constants[target], persistent=False)
                env[name] = graph.get_attr(target)
            elif op == "call_function":
                fn = _resolve(entry["target"])
                args = _dec({"t": entry["args"]["t"]}, env) if isinstance(entry["args"], dict) else ()
                kwargs = {k: _dec(v, env) for k, v in entry["kwargs"].items()}
                env[name] = graph.call_function(fn, args, kwargs)
            elif op == "output":
                graph.output(_dec(entry["args"], env)[0])
            else:
                raise GraphFileError(f"has an unsupported node kind {op!r}")
    except (KeyError, TypeError, IndexError) as exc:
        raise GraphFileError(f"is malformed ({type(exc).__name__}: {exc})") from exc
    return torch.fx.GraphModule(root, graph)


# --------------------------------------------------------------------------------------------- file I/O


def _digest(header: dict[str, Any], tensors: dict[str, Any]) -> str:
    h = hashlib.sha256(json.dumps(header, sort_keys=True).encode())
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(list(t.shape)).encode())
        h.update(t.view(-1).view(__import__("torch").uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def save_file(path: Path, header: dict[str, Any], tensors: dict[str, Any]) -> None:
    """One safetensors file: tensors + ``{"format", "marker", "header", "sha256"}`` metadata."""
    from safetensors.torch import save_file as st_save

    unique: dict[str, Any] = {}
    seen: dict[tuple, str] = {}
    aliases: dict[str, str] = {}
    for name, t in tensors.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        unique[name] = t.detach().contiguous().clone()
    header = {**header, "aliases": aliases}
    meta = {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "emulated": "true",
        "marker": MARKER,
        "header": json.dumps(header, sort_keys=True),
        "sha256": _digest(header, unique),
    }
    st_save(unique, str(path), metadata=meta)
    Path(path).chmod(0o644)  # safetensors writes 0600; an artifact is shared like the others


def check_file(path: Path) -> str | None:
    """Why the emulator would refuse ``path`` (reads and verifies it), or None."""
    try:
        load_file(Path(path))
    except GraphFileError as exc:
        return str(exc)
    return None


def load_file(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(header, tensors) of an emulated graph file; GraphFileError for anything the emulator did not write."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file as st_load

    meta = read_metadata(path)
    if not meta or meta.get("format") != FORMAT:
        raise GraphFileError("was not written by qvl's emulator (a real NPU graph or another file)")
    if meta.get("format_version") != str(FORMAT_VERSION):
        raise GraphFileError(f"has emulator format {meta.get('format_version')!r}, this qvl reads {FORMAT_VERSION}")
    try:
        header = json.loads(meta["header"])
        tensors = st_load(str(path))
    except (KeyError, ValueError, SafetensorError, OSError) as exc:
        raise GraphFileError(f"is damaged ({type(exc).__name__})") from exc
    if _digest(header, tensors) != meta.get("sha256"):
        raise GraphFileError("was modified after the emulator wrote it (sha256 mismatch)")
    for alias, name in (header.get("aliases") or {}).items():
        if name not in tensors:
            raise GraphFileError(f"refers to a missing tensor {name!r}")
        tensors[alias] = tensors[name]
    return header, tensors
