"""The artifact read once (issue 42 item 6): on serve's, bench-serve's and load-check's paths rbln_config.json and
qvl-manifest.json are opened once, every other small file at most once (a graph file twice: the emulator's marker,
then its hash), and a fleet builds each replica's launch from one check without opening the artifact again.

Counted by wrapping ``open`` itself (``io.open``, which ``Path.read_bytes`` calls, and the builtin, which hashing
calls), so any new path that reads a file again is caught, whatever function it goes through.
"""

from __future__ import annotations

import builtins
import io
import json
from collections import Counter
from pathlib import Path

import pytest

from qwenvl_rbln.artifacts.emulated import FORMAT
from qwenvl_rbln.artifacts.manifest import MANIFEST_NAME, RBLN_CONFIG_NAME, write_manifest
from qwenvl_rbln.planning.plan import build_plan
from tests.fakes_rbln import run_main, write_artifact


def _artifact(root: Path, preset: str = "rebel100-1npu", *, emulated: bool = False) -> Path:
    plan = build_plan(preset)
    write_artifact(root, plan)
    if emulated:  # the emulator's marker in every graph file, as tests/test_serve_emulate.py writes it
        header = json.dumps({"__metadata__": {"format": FORMAT}}).encode()
        for graph in [*root.glob("*.rbln"), root / "visual" / "compiled_model.rbln"]:
            graph.write_bytes(len(header).to_bytes(8, "little") + header)
    manifest = {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": "Qwen/Qwen3-VL-2B-Instruct"}}
    write_manifest(root, {**manifest, **({"emulated": True} if emulated else {})})
    return root


class Opens:
    """Every ``open`` while installed, as paths relative to ``root`` (files outside it are not counted)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.paths: list[str] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real = io.open

        def counted(file, *args, **kwargs):
            if isinstance(file, str | Path):
                self.paths.append(str(file))
            return real(file, *args, **kwargs)

        monkeypatch.setattr(io, "open", counted)
        monkeypatch.setattr(builtins, "open", counted)

    def counts(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for raw in self.paths:
            path = Path(raw).resolve()
            if path.is_relative_to(self.root):
                out[path.relative_to(self.root).as_posix()] += 1
        return out


def _walk(monkeypatch, capsys, root: Path, argv: list[str]) -> Counter[str]:
    opens = Opens(root)
    opens.install(monkeypatch)
    code, _, err = run_main(argv, capsys)
    monkeypatch.undo()
    assert code == 0, err
    return opens.counts()


def _assert_once(counts: Counter[str]) -> None:
    assert counts[RBLN_CONFIG_NAME] == 1, counts
    assert counts[MANIFEST_NAME] == 1, counts
    again = {name: n for name, n in counts.items() if n > 1 and not name.endswith(".rbln")}
    assert not again, f"read more than once: {again}"


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "{root}", "--dry-run", "--json"],
        ["serve", "{root}", "--dry-run"],
        ["serve", "{root}", "--device", "1", "--dry-run", "--json"],  # a remap: load-check's memory gate too
        ["bench-serve", "{root}", "--dry-run", "--json"],
        ["load-check", "{root}", "--no-runtime", "--json"],
        ["deploy", "{root}", "--artifact", "pvc:models", "--image", "reg.example/vllm-rbln:1", "--dry-run", "--json"],
    ],
    ids=["serve-json", "serve", "serve-remap", "bench-serve", "load-check", "deploy"],
)
def test_each_file_is_read_once(argv, tmp_path, monkeypatch, capsys):
    root = _artifact(tmp_path / "art")
    counts = _walk(monkeypatch, capsys, root, [a.format(root=root) for a in argv])
    _assert_once(counts)
    assert counts["config.json"] == 1 and counts["processor_config.json"] == 1


def test_serve_emulate_reads_each_file_once(tmp_path, monkeypatch, capsys):
    root = _artifact(tmp_path / "emu", "cpu-tiny-rbln", emulated=True)
    counts = _walk(monkeypatch, capsys, root, ["serve", str(root), "--emulate", "--dry-run", "--json"])
    _assert_once(counts)


def test_serve_of_a_fleet_reads_each_file_once_for_every_replica(tmp_path, monkeypatch, capsys):
    root = _artifact(tmp_path / "emu", "cpu-tiny-rbln", emulated=True)
    argv = ["serve", str(root), "--emulate", "--devices", "0,1,2", "--port", "9000", "--dry-run", "--json"]
    _assert_once(_walk(monkeypatch, capsys, root, argv))


def test_a_fleet_builds_every_replica_from_one_check_without_reading_again(tmp_path, monkeypatch):
    from qwenvl_rbln.serving.command import check_serve, replica_command, serve_command
    from qwenvl_rbln.serving.options import ServeOptions

    root = _artifact(tmp_path / "art")
    opts = ServeOptions(directory=root)
    check = check_serve(opts)
    opens = Opens(root)
    opens.install(monkeypatch)
    launches = [replica_command(check, ServeOptions(directory=root, port=8000 + i), {})[0] for i in range(3)]
    monkeypatch.undo()
    assert opens.counts() == Counter()  # the preflight ran once, in check_serve
    single, _ = serve_command(ServeOptions(directory=root, port=8001), {})
    assert launches[1].argv == single.argv and launches[1].env == single.env
    assert launches[1].checks == single.checks  # every replica has its own checks, none added twice
    assert [la.argv[la.argv.index("--port") + 1] for la in launches] == ["8000", "8001", "8002"]


def test_a_file_edited_after_compile_is_caught_from_the_bytes_read(tmp_path, capsys):
    """rbln_config.json is hashed from the bytes parsed, not read again: an edit still fails the manifest check."""
    root = _artifact(tmp_path / "art")
    cfg = json.loads((root / RBLN_CONFIG_NAME).read_text())
    (root / RBLN_CONFIG_NAME).write_text(json.dumps(cfg, indent=4))  # same values, other bytes
    code, _, err = run_main(["serve", str(root), "--dry-run"], capsys)
    assert code == 2 and f"{RBLN_CONFIG_NAME} changed or missing since compile" in err, err


def test_deploy_dry_run_builds_no_wheel_and_says_when_it_is_built(tmp_path, monkeypatch, capsys):
    from qwenvl_rbln.deploy import build as deploy_build
    from qwenvl_rbln.deploy.wheel import wheel_name

    root = _artifact(tmp_path / "art")
    monkeypatch.setattr(deploy_build, "build_wheel", lambda: pytest.fail("a dry run built the wheel"))
    argv = ["deploy", str(root), "--artifact", "pvc:models", "--image", "reg.example/vllm-rbln:1", "--dry-run"]
    code, out, err = run_main([*argv, "--json"], capsys)
    assert code == 0, err
    row = next(r for r in json.loads(out)["files"] if r["path"] == wheel_name())
    assert row["bytes"] is None and row["text"] is None
    code, out, err = run_main(argv, capsys)
    assert code == 0 and f"# ---- {wheel_name()} (binary, built when the folder is written: not shown) ----" in out
