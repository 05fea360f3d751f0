"""`qvl cache list`, `qvl cache prune`, `qvl cache rm KEY`: the compile cache, managed (modelled on `hf cache`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from qwenvl_rbln.commands.common import JsonOpt

CacheDirOpt = typer.Option(None, "--cache-dir", help="Compile cache (default: $QVL_HOME/compile-cache).")


def _root(cache_dir: Path | None) -> Path:
    from qwenvl_rbln.artifacts.cache import default_cache_dir
    from qwenvl_rbln.paths import user_path

    return user_path(cache_dir, "--cache-dir").absolute() if cache_dir else default_cache_dir()


def _table(console: Any, entries: list[dict[str, Any]]) -> None:
    from rich.table import Table

    from qwenvl_rbln.views.render import fmt_bytes, markup, one_line

    table = Table("key", "preset", "model", "overrides", "size", "last used", box=None, pad_edge=False)
    for e in entries:
        table.add_row(
            e["key"],
            markup("{}", one_line(e.get("preset") or "-")),
            markup("{}", one_line(e.get("model") or "-")),
            markup("{}", one_line(" ".join(e.get("overrides") or []) or "-")),  # what tells one preset's entries apart
            fmt_bytes(e["size_bytes"]),
            e["last_used"],
        )
    console.print(table)


def register(app: typer.Typer) -> None:
    cache = typer.Typer(help="List, prune and remove compile cache entries.", no_args_is_help=True)

    @cache.command("list")
    def list_cmd(cache_dir: Path = CacheDirOpt, as_json: bool = JsonOpt) -> None:
        """Entries with key, preset, model, --set overrides, size and last use (least recently used first), and
        the total."""
        from qwenvl_rbln.artifacts.cache_admin import list_entries
        from qwenvl_rbln.views import render
        from qwenvl_rbln.views.render import fmt_bytes

        root = _root(cache_dir)
        entries = list_entries(root)
        data = {"cache_dir": str(root), "entries": entries, "total_bytes": sum(e["size_bytes"] for e in entries)}

        def human(console: Any, d: dict[str, Any]) -> None:
            _table(console, d["entries"])
            console.print(
                f"{len(d['entries'])} entries, {fmt_bytes(d['total_bytes'])} in {d['cache_dir']}", markup=False
            )

        render.emit(data, as_json=as_json, human=human)

    @cache.command("prune")
    def prune_cmd(
        older_than: str = typer.Option(
            None, "--older-than", help="Remove entries not used for this long: 45s, 90m, 12h, 30d, 2w."
        ),
        max_size: str = typer.Option(
            None, "--max-size", help="Remove least recently used entries until the cache is at most this, e.g. 50GiB."
        ),
        dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be removed; remove nothing."),
        cache_dir: Path = CacheDirOpt,
        as_json: bool = JsonOpt,
    ) -> None:
        """Remove old entries, or the least recently used ones beyond a size, and the lock files of finished
        compiles. An entry a compile is using is skipped (and named)."""
        from qwenvl_rbln.artifacts.cache_admin import parse_duration, prune
        from qwenvl_rbln.errors import InputError
        from qwenvl_rbln.planning.catalogue.devices import parse_byte_size
        from qwenvl_rbln.views import render
        from qwenvl_rbln.views.render import fmt_bytes

        if older_than is None and max_size is None:
            raise InputError("prune needs --older-than or --max-size", "e.g. qvl cache prune --older-than 30d")
        result = prune(
            _root(cache_dir),
            older_than_s=parse_duration(older_than) if older_than is not None else None,
            max_size=parse_byte_size(max_size, "--max-size") if max_size is not None else None,
            dry_run=dry_run,
        )

        def human(console: Any, d: dict[str, Any]) -> None:
            verb = "would remove" if d["dry_run"] else "removed"
            if d["removed"]:
                console.print(verb + ":", markup=False)
                _table(console, d["removed"])
            for e in d["skipped_in_use"]:
                console.print(f"skipped {e['key']}: a compile is using it", markup=False)
            console.print(
                f"{verb} {len(d['removed'])} entries ({fmt_bytes(d['freed_bytes'])}); {d['entries_left']} left "
                f"({fmt_bytes(d['total_bytes_left'])}); {verb} {len(d['stale_locks_removed'])} stale lock files",
                markup=False,
            )

        render.emit(result, as_json=as_json, human=human)

    @cache.command("rm")
    def rm_cmd(
        key: str = typer.Argument(..., help="The entry's key (as `qvl cache list` shows it)."),
        cache_dir: Path = CacheDirOpt,
        as_json: bool = JsonOpt,
    ) -> None:
        """Remove one entry (refused while a compile is using it: exit 6)."""
        from qwenvl_rbln.artifacts.cache_admin import KEY_RE, list_entries, remove_entry
        from qwenvl_rbln.errors import BusyError, InputError
        from qwenvl_rbln.views import render

        root = _root(cache_dir)
        known = {e["key"]: e for e in list_entries(root)}
        if not KEY_RE.match(key) or key not in known:
            raise InputError(f"no compile cache entry {key!r} in {root}", "see `qvl cache list` for the keys")
        if not remove_entry(root, key):
            raise BusyError(f"cache entry {key} is in use by a compile", "wait for it to finish, then run rm again")
        render.emit(
            {"cache_dir": str(root), "removed": known[key]},
            as_json=as_json,
            human=lambda console, d: console.print(f"removed {d['removed']['key']}", markup=False),
        )

    app.add_typer(cache, name="cache")
