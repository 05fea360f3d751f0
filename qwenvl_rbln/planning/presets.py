"""Preset files: safe YAML, ``extends:``, ``--set`` overrides, and errors that name file and key.

A preset is plain data; turning it into a validated Plan is ``plan.py``'s job. This module only
produces the merged mapping plus, for each leaf key, where its value came from, so every later
message can say "configs/x.yaml: rbln_config.max_seq_len=...".
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import InputError
from qwenvl_rbln.paths import user_path

# Top-level preset keys and what they hold.
TOP_KEYS: dict[str, str] = {
    "description": "one-line description",
    "extends": "name or path of the preset this one builds on",
    "backend": "rbln (optimum-rbln on an NPU host) or torch (transformers reference)",
    "model": "hub id or local directory of the Qwen3-VL model",
    "npu": "compile target, e.g. RBLN-CR13 (Rebel100)",
    "output_dir": "where `qvl compile` writes artifacts",
    "rbln_config": "the optimum-rbln rbln_config tree, spelled as optimum-rbln spells it",
    "placement": "load-time device placement: device, visual_device",
    "processor": "pixel caps: min_pixels, max_pixels, video_min_pixels, video_max_pixels, fps, ...",
    "runtime": "no-recompile choices: vit_packing (true/false), limit_mm_per_prompt ({image: N, video: M}), "
    "on_oversize (resize/error)",
}
PLACEMENT_KEYS = ("device", "visual_device")
RUNTIME_KEYS = ("vit_packing", "limit_mm_per_prompt", "on_oversize")
PROCESSOR_KEYS = (
    "min_pixels",
    "max_pixels",
    "video_min_pixels",
    "video_max_pixels",
    "fps",
    "min_frames",
    "max_frames",
    "video_max_frame_pixels",
)


def preset_dirs() -> list[Path]:
    """Where named presets live: inside the wheel, or the repo's configs/ in a checkout."""
    here = Path(__file__).resolve().parents[1]  # the package root (planning/ sits one level below it)
    return [p for p in (here / "configs", here.parent / "configs") if p.is_dir()]


def list_preset_files() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in preset_dirs():
        for p in sorted(d.glob("*.yaml")):
            found.setdefault(p.stem, p)
    return found


def closest(word: str, options: list[str] | tuple[str, ...]) -> str | None:
    match = difflib.get_close_matches(word, list(options), n=1, cutoff=0.5)
    return match[0] if match else None


def _is_path_ref(ref: str) -> bool:
    return ref.endswith((".yaml", ".yml")) or "/" in ref or "\\" in ref


def resolve_ref(ref: str, relative_to: Path | None = None) -> Path:
    """A preset name (configs/NAME.yaml) or a path to a YAML file."""
    if _is_path_ref(ref):
        path = user_path(ref, "preset file")
        if not path.is_absolute() and relative_to is not None and not path.exists():
            path = relative_to / path
        if not path.is_file():
            raise InputError(
                f"preset file {ref} does not exist", "check the path, or use a name from `qvl presets list`"
            )
        return path.resolve()
    presets = list_preset_files()
    if ref in presets:
        return presets[ref]
    near = closest(ref, list(presets))
    hint = f"did you mean '{near}'? " if near else ""
    raise InputError(
        f"unknown preset '{ref}' (known: {', '.join(presets) or 'none'})",
        f"{hint}use one of the known names, or a path to a .yaml file",
    )


# A preset is small, plain data. These bound what a hostile file can make qvl walk, copy or hash: YAML
# aliases make a DAG whose expansion doubles per level (30 lines -> 2^30 values), and deep nesting
# overflows the recursion of the YAML composer, json and deepcopy.
MAX_DEPTH = 32
MAX_VALUES = 100_000


def _short(value: Any, limit: int = 60) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int over Python's 4300-digit conversion limit
        text = f"<{value.bit_length()}-bit integer>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _clip(text: str, limit: int = 60) -> str:
    """Text as typed, cut to ``limit`` characters (a 100 kB --set key is not echoed back whole)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_plain_data(data: Any, origin: str) -> None:
    """Presets and --set values are JSON-shaped: str keys; str/int/float/bool/null, lists and mappings.

    Iterative (no recursion), and it stops at ``MAX_VALUES`` visited values or ``MAX_DEPTH`` levels, so an
    alias bomb is refused after a bounded walk. YAML dates, sets and binary are refused with the key named.
    """
    stack: list[tuple[Any, int, str]] = [(data, 0, "")]
    seen = 0
    while stack:
        node, depth, where = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise InputError(
                f"{origin}: more than {MAX_VALUES} values (YAML aliases that expand exponentially?)",
                "a preset is a few dozen keys: write the values out instead of nesting aliases",
            )
        if depth > MAX_DEPTH:
            raise InputError(
                f"{origin}: {where or 'the value'} is nested more than {MAX_DEPTH} levels deep",
                "flatten it: no optimum-rbln option nests that deep",
            )
        if isinstance(node, dict):
            for key, value in node.items():
                if not isinstance(key, str):
                    inside = f" in {where}" if where else ""
                    raise InputError(f"{origin}: key {_short(key)}{inside} is not a string", "quote the key")
                stack.append((value, depth + 1, f"{where}.{key}" if where else key))
        elif isinstance(node, list):
            stack.extend((value, depth + 1, f"{where}[{i}]") for i, value in enumerate(node))
        elif isinstance(node, int) and node.bit_length() > 128:  # 0xfff... : Python cannot even print it
            raise InputError(f"{origin}: {where or 'value'} is a {node.bit_length()}-bit integer", "use a real size")
        elif node is not None and not isinstance(node, bool | int | float | str):
            raise InputError(
                f"{origin}: {where or 'value'}={_short(node)} is a YAML {type(node).__name__}, not a plain value",
                "quote it to keep it as text (e.g. '2024-01-01'); presets hold strings, numbers, lists and mappings",
            )


class _DuplicateKey(Exception):
    """A key given twice in one mapping: YAML would silently keep the last, hiding the first."""

    def __init__(self, key: Any, line: int, first_line: int):
        super().__init__(key)
        self.key, self.line, self.first_line = key, line, first_line


class _UniqueKeys:
    """Constructor mixin: refuse a mapping that repeats a key (merge keys ``<<`` may still be overridden)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        import yaml

        if isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # list/mapping keys are refused later as keys that are not strings
                key = self.construct_object(key_node)
                line = key_node.start_mark.line + 1
                try:
                    if key in first:
                        raise _DuplicateKey(key, line, first[key])
                    first[key] = line
                except TypeError:  # unhashable: PyYAML's own check names it
                    continue
        return super().construct_mapping(node, deep=deep)


_LOADERS: dict[str, type] = {}


def _loader_class(yaml: Any) -> type:
    """SafeLoader with unique keys, on libyaml's C parser when present (5x faster; same safe constructors)."""
    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    if base.__name__ not in _LOADERS:
        _LOADERS[base.__name__] = type(f"Unique{base.__name__}", (_UniqueKeys, base), {})
    return _LOADERS[base.__name__]


def _safe_load(yaml: Any, text: str) -> Any:
    """yaml.safe_load plus duplicate-key refusal."""
    loader = _loader_class(yaml)(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _syntax_error(path: Path, exc: Any) -> InputError:
    """Where the parser gave up, and where the construct it was reading opens (an unclosed [ or quote)."""
    mark = exc.problem_mark or exc.context_mark
    line = mark.line + 1 if mark else "?"
    col = mark.column + 1 if mark else "?"
    message = f"{path} line {line} column {col}: YAML syntax error: {exc.problem or exc.context}"
    hint = "fix the YAML at that line (indentation, a missing ':' or quote)"
    opened = exc.context_mark
    if opened is not None and exc.problem and exc.context and (opened.line, opened.column) != (mark.line, mark.column):
        what = str(exc.context).removeprefix("while parsing ").removeprefix("while scanning ")
        message += f" (in {what} that starts at line {opened.line + 1} column {opened.column + 1})"
        if "flow" in what or "quoted" in what:
            hint = f"close the bracket or quote opened at line {opened.line + 1}, or fix the YAML at line {line}"
        else:
            hint = f"fix the YAML at line {line} (indentation, a missing ':' or quote), in {what} from line "
            hint += str(opened.line + 1)
    return InputError(message, hint)


def read_yaml(path: Path) -> dict[str, Any]:
    """Safe loading only: a YAML tag such as !!python/object is an error, never executed."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read preset {path}: {exc}", "check the file exists and is UTF-8 text") from None
    try:
        data = _safe_load(yaml, text)
    except _DuplicateKey as dup:
        raise InputError(
            f"{path} line {dup.line}: duplicate key {_short(dup.key)} (already given at line {dup.first_line})",
            "give each key once: YAML would silently keep only the last value",
        ) from None
    except yaml.constructor.ConstructorError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else "?"
        if "unhashable" in str(exc.problem):
            raise InputError(
                f"{path} line {line}: a mapping key is itself a list or a mapping ({exc.problem})",
                "keys are plain words: write `key: value`",
            ) from None
        raise InputError(
            f"{path} line {line}: YAML tag not allowed ({exc.problem})",
            "presets are plain YAML: remove the !!tag; qvl loads YAML safely and never builds objects from it",
        ) from None
    except yaml.MarkedYAMLError as exc:
        raise _syntax_error(path, exc) from None
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: YAML error: {' '.join(str(exc).split())}", "fix the YAML syntax") from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply to be a preset", "flatten the YAML") from None
    except Exception as exc:  # noqa: BLE001 - PyYAML's constructors raise plain ValueError, IndexError, ...
        # for a date such as 2024-13-45, a 5000-digit number, an empty !!float or !!timestamp
        raise InputError(
            f"{path}: a value cannot be read ({type(exc).__name__}: {_short(str(exc), 120)[1:-1]})",
            "quote dates and very long numbers to keep them as text, or fix the value",
        ) from None
    check_plain_data(data, str(path))
    if data is None:  # empty, or only comments: say so, rather than fail later on a key it never set
        raise InputError(
            f"{path}: the preset file is empty (no keys)",
            "write the keys it changes over a shipped preset, e.g. `extends: rebel100-1npu` then `rbln_config:` "
            "(see `qvl presets show rebel100-1npu`)",
        )
    if not isinstance(data, dict):
        raise InputError(
            f"{path}: a preset must be a mapping of keys, got {type(data).__name__}",
            "start the file with keys such as `description:` and `rbln_config:`",
        )
    return data


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; every other value (lists included) is replaced."""
    result = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = deep_merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def leaf_paths(data: dict[str, Any], prefix: str = "") -> list[str]:
    paths: list[str] = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            paths.extend(leaf_paths(value, path + "."))
        else:
            paths.append(path)
    return paths


EMPTY_VALUE_HINT = "give a value, e.g. --set batch_size=4 (null unsets a key, '\"\"' is an empty string)"


def parse_set_value(raw: str) -> Any:
    """JSON first (numbers, lists, objects, true/false/null), then yes/no words, else the text."""
    text = raw.strip()
    if not text:
        raise InputError("--set value is empty", EMPTY_VALUE_HINT)
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        if text[0] in '[{"':
            raise InputError(
                f"--set value {_short(raw)} looks like JSON but does not parse",
                "write lists as JSON, e.g. --set visual.max_seq_len=[1024,16384]",
            ) from None
    except RecursionError:
        raise InputError(f"--set value {_short(raw)} is nested too deeply", "flatten the value") from None
    except ValueError as exc:  # an integer over Python's 4300-digit conversion limit
        raise InputError(f"--set value {_short(raw)} cannot be read ({exc})", "use a smaller number") from None
    else:
        check_plain_data(value, "--set value")
        return value
    lowered = text.lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    if lowered in ("null", "none"):
        return None
    return text


def set_route(key: str) -> list[str]:
    """Dotted key to path: top-level preset keys stay, anything else goes under rbln_config."""
    parts = key.split(".")
    if any(not p.strip() or p != p.strip() for p in parts):
        raise InputError(f"--set key {_short(key)} has an empty or padded segment", "write it as dotted.key=value")
    if parts[0] == "extends":
        raise InputError(
            f"--set {_clip(key)}: extends cannot be changed with --set (qvl would ignore it)",
            "choose the base preset with --preset NAME, or write a YAML file with `extends: NAME` and pass its path",
        )
    if parts[0] in TOP_KEYS:
        return parts
    return ["rbln_config", *parts]


def parse_set(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise InputError(
            f"malformed --set {_short(item)}: expected KEY=VALUE",
            "e.g. --set max_seq_len=32768 or --set visual.max_seq_len=[1024,16384]",
        )
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise InputError(f"malformed --set {_short(item)}: the key is empty", "e.g. --set batch_size=4")
    route = set_route(key)
    if not raw.strip():
        hint = EMPTY_VALUE_HINT.replace("batch_size=4", f"{_clip(key)}=VALUE")
        raise InputError(f"--set {_clip(key)}= has no value", hint)
    return route, parse_set_value(raw)


def _assign(data: dict[str, Any], path: list[str], value: Any, origin: str) -> None:
    node = data
    for i, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(path[: i + 1])
            raise InputError(f"{origin}: cannot set {'.'.join(path)}: {where} is not a mapping", "check the key")
        node = child
    node[path[-1]] = value


@dataclass
class LoadedPreset:
    """The merged preset plus where each value came from."""

    name: str
    path: Path
    data: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)
    chain: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def source_of(self, dotted: str) -> str:
        """The file (or --set) that gave a key, falling back to its nearest parent."""
        probe = dotted
        while probe:
            if probe in self.sources:
                return self.sources[probe]
            probe = probe.rpartition(".")[0]
        return str(self.path)

    def content_hash(self) -> str:
        canonical = json.dumps(self.data, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()


def _load_chain(path: Path, stack: list[Path], warnings: list[str]) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """Merge a file over its ``extends:`` parents; old spellings are rewritten per file, before the merge."""
    if path in stack:
        cycle = " -> ".join(p.name for p in [*stack, path])
        raise InputError(f"extends cycle: {cycle}", f"remove the `extends:` in {stack[-1]} that points back")
    data = read_yaml(path)
    display = _display(path)
    base: dict[str, Any] = {}
    sources: dict[str, str] = {}
    chain: list[str] = []
    parent = data.pop("extends", None)
    if parent is not None:
        if not isinstance(parent, str) or not parent.strip():
            raise InputError(
                f"{display}: extends must be a preset name or path, got {parent!r}", "e.g. extends: rebel100-1npu"
            )
        try:
            parent_path = resolve_ref(parent, relative_to=path.parent)
        except InputError as exc:  # say which file's extends: points nowhere
            raise InputError(f"{display}: extends: {exc.message}", exc.hint) from None
        base, sources, chain = _load_chain(parent_path, [*stack, path], warnings)
    rewrite_deprecated(data, display, warnings)
    check_keys(data, display)
    for leaf in leaf_paths(data):
        sources[leaf] = display
    return deep_merge(base, data), sources, [*chain, display]


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        for d in preset_dirs():
            if path.parent == d.resolve():
                return f"configs/{path.name}"
        return str(path)


def display_path(path: Path) -> str:
    """A preset file as errors name it (the spelling ``LoadedPreset.sources`` records)."""
    return _display(path)


def check_keys(data: dict[str, Any], origin: str) -> None:
    """Top-level and fixed-schema sections; rbln_config keys are checked by plan.py against optimum-rbln."""
    for key in data:
        if key not in TOP_KEYS:
            near = closest(str(key), list(TOP_KEYS))
            hint = f"did you mean '{near}'?" if near else f"valid keys: {', '.join(TOP_KEYS)}"
            raise InputError(f"{origin}: unknown key '{key}'", hint)
    for section, allowed in (("placement", PLACEMENT_KEYS), ("processor", PROCESSOR_KEYS), ("runtime", RUNTIME_KEYS)):
        value = data.get(section)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise InputError(
                f"{origin}: {section} must be a mapping, got {value!r}", f"valid keys: {', '.join(allowed)}"
            )
        for key in value:
            if key not in allowed:
                near = closest(str(key), allowed)
                hint = f"did you mean '{section}.{near}'?" if near else f"valid keys: {', '.join(allowed)}"
                raise InputError(f"{origin}: unknown key '{section}.{key}'", hint)


def _first_missing(data: dict[str, Any], route: list[str]) -> int:
    """Index of the first mapping on ``route`` that ``data`` does not have yet (``len(route)`` if all exist)."""
    node: Any = data
    for i, part in enumerate(route[:-1]):
        if not isinstance(node, dict) or part not in node:
            return i
        node = node[part]
    return len(route)


def describe_presets() -> list[dict[str, str]]:
    """`qvl presets list`: each shipped preset's name, one-line description and file."""
    return [
        {"name": name, "description": load_preset(name).data.get("description", ""), "path": str(path)}
        for name, path in list_preset_files().items()
    ]


def load_preset(ref: str, sets: list[str] | None = None) -> LoadedPreset:
    """Load a preset by name or path, apply ``extends:`` then ``--set`` overrides."""
    path = resolve_ref(ref)
    warnings: list[str] = []
    data, sources, chain = _load_chain(path, [], warnings)
    name = path.stem if not _is_path_ref(ref) else ref
    spelled: dict[str, bool] = {}  # dotted route -> set through a deprecated spelling
    for item in sets or []:
        route, value = parse_set(item)
        route, value, renamed = _rewrite_set(route, value, warnings)
        dotted = ".".join(route)
        if spelled.get(dotted, renamed) != renamed:
            raise InputError(
                f"--set gives {dotted} twice, once through its deprecated spelling",
                f"keep only --set {dotted.removeprefix('rbln_config.')}=...",
            )
        spelled[dotted] = renamed
        fresh = _first_missing(data, route)
        _assign(data, route, value, "--set")
        for i in range(fresh, len(route) - 1):  # mappings this --set created are its own, not the file's
            sources[".".join(route[: i + 1])] = "--set"
        for key in [k for k in sources if k == dotted or k.startswith(dotted + ".")]:
            del sources[key]
        if isinstance(value, dict):
            for leaf in leaf_paths(value, dotted + "."):
                sources[leaf] = "--set"
        sources[dotted] = "--set"
    check_keys(data, "--set" if sets else _display(path))
    return LoadedPreset(name=name, path=path, data=data, sources=sources, chain=chain, warnings=warnings)


_REMOVED = "the pre-0.12 spelling: optimum-rbln 0.11 deprecated it and 0.12 refuses it ('Unexpected arguments')"
_DEPRECATED = "deprecated: optimum-rbln 0.12 still accepts it with a warning, and 0.13 removes it"

# Old spellings -> (new key, why). Rewritten in each file and each --set before merging, so an old key in a
# child preset or on the command line overrides the parent's new one, exactly as the new spelling would.
DEPRECATED_ALIASES: dict[str, tuple[str, str]] = {
    "rbln_config.visual.max_seq_lens": ("max_seq_len", _REMOVED),
    "rbln_config.tensor_parallel_size": ("num_devices", _DEPRECATED),
    "rbln_config.visual.tensor_parallel_size": ("num_devices", _DEPRECATED),
    "rbln_config._torch_dtype": ("dtype", _DEPRECATED),
    "rbln_config.visual._torch_dtype": ("dtype", _DEPRECATED),
}


def _node_at(data: dict[str, Any], parents: list[str]) -> dict[str, Any] | None:
    node: Any = data
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


def _rename_key(node: dict[str, Any], old: str, new: str) -> None:
    """Rename in place, keeping the key's position (the compile dict follows the preset's order)."""
    items = [(new if k == old else k, v) for k, v in node.items() if k != new]
    node.clear()
    node.update(items)


def rewrite_deprecated(data: dict[str, Any], origin: str, warnings: list[str]) -> None:
    """Rewrite old spellings within ONE source (a file, a --set); both spellings in that one source is an error."""
    for dotted, (new, why) in DEPRECATED_ALIASES.items():
        *parents, old = dotted.split(".")
        node = _node_at(data, parents)
        if node is None or old not in node:
            continue
        new_dotted = ".".join([*parents, new])
        if node.get(new) is not None:
            raise InputError(
                f"{origin}: both {dotted} (deprecated) and {new_dotted} are set", f"keep only {new_dotted}"
            )
        _rename_key(node, old, new)
        warnings.append(f"{origin}: {dotted} is {why}; rewritten to {new_dotted}")


def _rewrite_set(route: list[str], value: Any, warnings: list[str]) -> tuple[list[str], Any, bool]:
    """One --set: an old key in the route is renamed; one inside a mapping value is rewritten there."""
    for dotted, (new, why) in DEPRECATED_ALIASES.items():
        old_path = dotted.split(".")
        if route[: len(old_path)] == old_path:
            new_route = [*old_path[:-1], new, *route[len(old_path) :]]
            warnings.append(f"--set: {dotted} is {why}; rewritten to {'.'.join(new_route)}")
            return new_route, value, True
    if isinstance(value, dict):
        holder: dict[str, Any] = {}
        _assign(holder, route, copy.deepcopy(value), "--set")
        rewrite_deprecated(holder, "--set", warnings)
        value = _node_at(holder, route[:-1])[route[-1]]
    return route, value, False
