"""ViT packing end to end under the CPU emulator (emulated: no NPU ran): optimum-rbln's real compile, load and
generate of the tiny Qwen3-VL (preset cpu-tiny-rbln, buckets 256/1024/4096, batch_size 2), with qvl's packed
``visual`` forward on and off. Tokens and ViT outputs must not change; the compiled ViT calls drop as the
planner says, and ``timings.vision_calls`` counts them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
av = pytest.importorskip("av")

from qwenvl_rbln.backends import vit_packing as vp  # noqa: E402
from qwenvl_rbln.vision.packing import plan_packs  # noqa: E402
from tests.helpers_cli import run_qvl  # noqa: E402

N = 6  # new tokens per request


@pytest.fixture(scope="module")
def art(tmp_path_factory) -> Path:
    """`qvl compile --preset cpu-tiny-rbln` on the emulator (the compile cache under the tests' QVL_HOME is shared)."""
    out = tmp_path_factory.mktemp("emu") / "tiny-rbln"
    r = run_qvl("compile", "--preset", "cpu-tiny-rbln", "-o", str(out), env={"QVL_EMULATE_NPU": "1"}, timeout=600)
    assert r.exit_code == 0, r.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def emulated():
    from qwenvl_rbln.backends import emulator

    with emulator.active():
        yield


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> dict[str, Path]:
    import numpy as np
    from PIL import Image

    d = tmp_path_factory.mktemp("media")
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    for name, (w, h) in {"small": (224, 224), "a": (320, 240), "b": (320, 240), "c": (240, 320)}.items():
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(d / f"{name}.png")
        out[name] = d / f"{name}.png"
    video = d / "clip.mp4"  # 16 frames 64x64 at 8 fps: 2 s -> 4 sampled frames -> 2 temporal patches of 16 patches
    with av.open(str(video), "w") as container:
        stream = container.add_stream("mpeg4", rate=8)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        for i in range(16):
            frame = rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)
            frame[:, : 4 * (i + 1)] = (255, 10 * i, 0)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    out["video"] = video
    return out


def infer(art: Path, monkeypatch, packing: bool, **kw: Any) -> tuple[dict[str, Any], list[Any]]:
    """run_infer with the ViT outputs of every visual() call recorded (the packed forward is wrapped)."""
    from qwenvl_rbln.inference.runner import InferOptions, run_infer

    seen: list[Any] = []
    inner = vp.packed_forward

    def recording(self, hidden_states, grid_thw):
        out = inner(self, hidden_states, grid_thw)
        seen.append((grid_thw.clone(), out[0].clone(), [d.clone() for d in out[1]]))
        return out

    monkeypatch.setattr(vp, "packed_forward", recording)
    data = run_infer(InferOptions(directory=art, max_new_tokens=N, vit_packing=packing, **kw))
    monkeypatch.setattr(vp, "packed_forward", inner)
    return data, seen


def same_vit(a: list[Any], b: list[Any]) -> float:
    assert len(a) == len(b) and all(torch.equal(x[0], y[0]) for x, y in zip(a, b, strict=True))
    diffs = [(x[1] - y[1]).abs().max().item() for x, y in zip(a, b, strict=True)]
    diffs += [(p - q).abs().max().item() for x, y in zip(a, b, strict=True) for p, q in zip(x[2], y[2], strict=True)]
    return max(diffs)


def planned_calls(vit: dict[str, Any], art: Path) -> int:
    buckets = json.loads((art / "rbln_config.json").read_text())["visual"]["max_seq_len"]
    return sum(plan_packs(call["lengths"], buckets).calls for call in vit["visual_calls"])


def test_image_several_images_and_a_batch(art, emulated, media, monkeypatch, tmp_path):
    batch = tmp_path / "batch.jsonl"
    lines = [
        {"id": "one", "prompt": "Describe this image.", "images": [str(media["small"])]},
        {"id": "three", "prompt": "Compare them.", "images": [str(media[k]) for k in ("a", "b", "c")]},
    ]
    batch.write_text("".join(json.dumps(x) + "\n" for x in lines))
    on, seen_on = infer(art, monkeypatch, True, batch_file=batch)
    off, seen_off = infer(art, monkeypatch, False, batch_file=batch)
    assert [r["token_ids"] for r in on["requests"]] == [r["token_ids"] for r in off["requests"]]
    assert all(r["num_tokens"] == N for r in on["requests"])
    assert same_vit(seen_on, seen_off) <= 1e-5  # fp32 tiny model: the ViT's main and DeepStack outputs
    vit_on, vit_off = on["batches"][0]["vit"], off["batches"][0]["vit"]
    assert vit_off["graph_calls"] == vit_off["unpacked_calls"] == 4  # 1 + 3 images, one visual() call
    assert vit_on["graph_calls"] == planned_calls(vit_on, art) == 2  # 256-patch image alone; 3 x 320 in one 1024
    assert on["batches"][0]["timings"]["vision_calls"] == 2 and off["batches"][0]["timings"]["vision_calls"] == 4
    packs = [p for c in vit_on["visual_calls"] for p in c["packs"]]
    assert sorted(p["bucket"] for p in packs) == [256, 1024] and all(p["padding"] >= 0 for p in packs)
    assert on["runtime"]["vit_packing"] is True and off["runtime"]["vit_packing"] is False


def test_video(art, emulated, media, monkeypatch):
    kw = {"videos": [str(media["video"])], "prompt": "What happens?"}
    on, seen_on = infer(art, monkeypatch, True, **kw)
    off, seen_off = infer(art, monkeypatch, False, **kw)
    assert on["requests"][0]["token_ids"] == off["requests"][0]["token_ids"]
    assert same_vit(seen_on, seen_off) <= 1e-5
    vit_on, vit_off = on["batches"][0]["vit"], off["batches"][0]["vit"]
    # batch_size 2: the padding row is text only, so the visual() call holds the real row's 2 temporal patches
    assert vit_off["graph_calls"] == vit_off["unpacked_calls"] == 2
    assert vit_on["graph_calls"] == planned_calls(vit_on, art) == 1
    assert on["batches"][0]["timings"]["vision_calls"] == 1 and off["batches"][0]["timings"]["vision_calls"] == 2


def test_preset_runtime_key_turns_it_off(art, emulated, media, monkeypatch):
    on, _ = infer(art, monkeypatch, True, images=[str(media["a"]), str(media["b"])], prompt="Two.")
    off, _ = infer(
        art,
        monkeypatch,
        True,
        images=[str(media["a"]), str(media["b"])],
        prompt="Two.",
        sets=["runtime.vit_packing=false"],
    )
    assert on["batches"][0]["vit"]["packing"] and not off["batches"][0]["vit"]["packing"]
    assert on["batches"][0]["vit"]["graph_calls"] < off["batches"][0]["vit"]["graph_calls"]
    assert on["requests"][0]["token_ids"] == off["requests"][0]["token_ids"]


def test_a_compile_time_runtime_vit_packing_false_holds_at_infer(art, emulated, media, monkeypatch, tmp_path):
    import shutil

    copy = tmp_path / "no-packing"
    shutil.copytree(art, copy)
    manifest = json.loads((copy / "qvl-manifest.json").read_text())
    manifest["runtime"] = {**manifest.get("runtime", {}), "vit_packing": False}  # as --set runtime.vit_packing=false
    (copy / "qvl-manifest.json").write_text(json.dumps(manifest))
    off, _ = infer(copy, monkeypatch, True, images=[str(media["a"]), str(media["b"])], prompt="Two.")
    assert not off["batches"][0]["vit"]["packing"] and off["runtime"]["vit_packing"] is False


def test_human_line():
    from qwenvl_rbln.commands.infer_cmd import vit_line

    vit = {
        "packing": True,
        "graph_calls": 1,
        "unpacked_calls": 3,
        "visual_calls": [{"packs": [{"bucket": 1024, "lengths": [320, 320, 320], "padding": 64}]}],
    }
    assert vit_line(vit) == "  ViT: 1 graph call for 3 segments (packed): 1024 [320+320+320, pad 64]"
