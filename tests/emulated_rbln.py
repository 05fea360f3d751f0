"""optimum-rbln 0.12's real code on qvl's CPU emulator of rebel, for tests. Everything here is emulated: no NPU ran.

- ``compile_emulated(out, sets, preset)``: ``run_compile`` on the emulator through the compile cache under the
  tests' QVL_HOME (tests/conftest.py), so each compile configuration costs one emulated compile per session;
  placement is a runtime key, so another placement of the same graphs is a cache hit.
- ``record_rbln(monkeypatch)``: wraps, never replaces, optimum-rbln's ``from_pretrained`` (the auto class qvl
  calls), ``generate``, ``save_pretrained`` and ``RBLNBaseModel.compile``, and the emulator's ``Runtime``, so a
  test sees exactly what qvl passed to them while the real code runs.

The fixtures that use these (``emulated``, ``rbln_calls``, ``tiny_rbln``) are in tests/conftest.py.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib import util
from pathlib import Path
from typing import Any


def optimum_rbln_installed() -> bool:
    try:
        return util.find_spec("optimum.rbln") is not None
    except (ImportError, ValueError):
        return False


@contextlib.contextmanager
def emulator_on() -> Iterator[None]:
    """qvl's CPU emulator served as ``rebel`` (removed again afterwards unless it was on before), with one torch
    thread meanwhile: the tiny model's ops take microseconds, and on a busy 2-core box a second OpenMP thread only
    makes each of them wait (tests/test_emulator.py measured 40 ms instead of 0.1 ms per attention step)."""
    import torch

    from qwenvl_rbln.backends import emulator

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with emulator.active():
            yield
    finally:
        torch.set_num_threads(threads)


def compile_emulated(
    out: Path, sets: Sequence[str] = (), preset: str = "cpu-tiny-rbln", *, model: str | None = None
) -> Path:
    """``qvl compile --preset PRESET --set ... -o OUT --emulate`` in-process, through the default compile cache."""
    from qwenvl_rbln.jobs.compile_job import run_compile
    from qwenvl_rbln.memory.planner import estimate_plan
    from qwenvl_rbln.planning.plan import build_plan

    with emulator_on():
        plan = build_plan(preset, list(sets), model=model, output_dir=str(out))
        run_compile(plan, estimate_plan(plan), heartbeat_s=0)
    return Path(out)


@dataclass
class RblnCalls:
    """What qvl handed optimum-rbln and the emulated rebel (same record shapes as tests/fakes_rbln.py's fakes)."""

    calls: list[dict[str, Any]] = field(default_factory=list)  # from_pretrained on the auto class, export or load
    generates: list[dict[str, Any]] = field(default_factory=list)
    saves: list[str] = field(default_factory=list)
    compiled: list[str] = field(default_factory=list)  # RBLNBaseModel.compile: compiled_model_name per graph
    runtimes: list[tuple[str, Any]] = field(default_factory=list)  # (graph file, device) per Runtime created
    runtime_objects: list[Any] = field(default_factory=list)  # the emulator's Runtime objects (``.calls`` counts runs)

    def graph_runs(self, file_name: str) -> int:
        """How many times the emulator ran the graphs of ``file_name`` (e.g. ``compiled_model.rbln``: the ViT)."""
        return sum(rt.calls for rt in self.runtime_objects if Path(str(rt.compiled_model.path)).name == file_name)

    @property
    def loads(self) -> list[dict[str, Any]]:
        return [c for c in self.calls if not c["export"]]

    @property
    def exports(self) -> list[dict[str, Any]]:
        return [c for c in self.calls if c["export"]]


def record_rbln(monkeypatch: Any) -> RblnCalls:
    """Record optimum-rbln's entry points (the emulator must be active: optimum.rbln imports rebel)."""
    from qwenvl_rbln.backends import emulator
    from qwenvl_rbln.backends.emulator import rebel_api

    with emulator.quiet_optimum_import():
        import optimum.rbln as orbln
        from optimum.rbln.modeling_base import RBLNBaseModel
    rec = RblnCalls()

    auto = orbln.RBLNAutoModelForImageTextToText
    real_from_pretrained = auto.from_pretrained

    def from_pretrained(cls: Any, model_id: Any, export: Any = None, rbln_config: Any = None, **kwargs: Any) -> Any:
        rec.calls.append(
            {
                "model_id": str(model_id),
                "export": export,
                "rbln_config": copy.deepcopy(rbln_config),
                "kwargs": dict(kwargs),
            }
        )
        return real_from_pretrained(model_id, export=export, rbln_config=rbln_config, **kwargs)

    monkeypatch.setattr(auto, "from_pretrained", classmethod(from_pretrained))

    lm_cls = orbln.RBLNQwen3VLForConditionalGeneration
    real_generate = lm_cls.generate

    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        input_ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        options = {k: v for k, v in kwargs.items() if not hasattr(v, "shape")}
        grid = kwargs.get("image_grid_thw")
        rec.generates.append(
            {
                "rows": int(input_ids.shape[0]),
                "input_ids": input_ids.tolist(),
                "image_grid_thw": grid.tolist() if grid is not None else None,
                "options": sorted(options),
                "max_new_tokens": options.get("max_new_tokens"),
                "do_sample": options.get("do_sample"),
            }
        )
        return real_generate(self, *args, **kwargs)

    monkeypatch.setattr(lm_cls, "generate", generate)

    real_save = RBLNBaseModel.save_pretrained

    def save_pretrained(self: Any, save_directory: Any, *args: Any, **kwargs: Any) -> Any:
        rec.saves.append(str(save_directory))
        return real_save(self, save_directory, *args, **kwargs)

    monkeypatch.setattr(RBLNBaseModel, "save_pretrained", save_pretrained)

    real_compile = RBLNBaseModel.__dict__["compile"].__func__

    def compile_graph(cls: Any, model: Any, rbln_compile_config: Any = None, *args: Any, **kwargs: Any) -> Any:
        rec.compiled.append(rbln_compile_config.compiled_model_name)
        return real_compile(cls, model, rbln_compile_config, *args, **kwargs)

    monkeypatch.setattr(RBLNBaseModel, "compile", classmethod(compile_graph))

    real_runtime_init = rebel_api.Runtime.__init__

    def runtime_init(self: Any, compiled_model: Any, *args: Any, **kwargs: Any) -> None:
        real_runtime_init(self, compiled_model, *args, **kwargs)
        rec.runtimes.append((str(compiled_model.path), self.device))
        rec.runtime_objects.append(self)

    monkeypatch.setattr(rebel_api.Runtime, "__init__", runtime_init)
    return rec


def generate_logits(model: Any, inputs: Any, new_tokens: int) -> tuple[list[int], Any]:
    """Greedy tokens of the first row and its per-step logits (fp32), from transformers' or optimum-rbln's
    ``generate``: what the logits-vs-reference tests compare."""
    import torch

    with torch.inference_mode():
        out = model.generate(
            **inputs, max_new_tokens=new_tokens, do_sample=False, output_logits=True, return_dict_in_generate=True
        )
    prompt = inputs["input_ids"].shape[1]
    return out.sequences[0, prompt:].tolist(), torch.stack([x[0].float() for x in out.logits])


def image_prompt_inputs(model_dir: Path, image: Path) -> Any:
    """The processor's inputs for two identical rows (the tiny presets' compiled batch 2) of one image and
    "Describe this image.", from the model directory's own processor."""
    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(model_dir))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe this image."}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    rgb = Image.open(image).convert("RGB")
    return processor(text=[text, text], images=[rgb, rgb], return_tensors="pt", padding=True)


def emulated_model(art: Path) -> Any:
    """An artifact loaded through optimum-rbln on qvl's emulator (devices 0, 0), ready for ``generate``."""
    from qwenvl_rbln.backends.rbln import optimum as rbln_backend

    assert rbln_backend.use_emulator(True)
    return rbln_backend.load_model(art, 0, 0)
