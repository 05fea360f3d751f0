"""`qvl infer`: run compiled artifacts (rbln) or the torch reference on images, videos and text.

Streams the text as it is generated (stdout; stderr with --json, so stdout stays one JSON document),
then shows what the static-shape hardware does with each request: per image/video the resized size,
ViT patches, bucket and padding; per batch the decoder graph and the rows padded to reach it; timings
and memory. See ``qwenvl_rbln/inference/target.py`` for how DIR, the preset and the backend are chosen.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from qwenvl_rbln.commands import infer_batch
from qwenvl_rbln.commands.common import JsonOpt, SetOpt
from qwenvl_rbln.commands.infer_batch import DevicesOpt, OutputOpt, RayAddressOpt, ResumeOpt, WorkersOpt


def _fmt_s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _vision_row(it: dict[str, Any]) -> list[str]:
    size = f"{it['width']}x{it['height']} -> {it['resized_width']}x{it['resized_height']}"
    if it["kind"] == "video":
        patches = f"{it['calls']} x {it['patches']}"
        size += f", {it['frames']} frames"
    else:
        patches = str(it["patches"])
    if it.get("patches_before_cap"):
        size += f" (capped from {it['patches_before_cap']} patches: --on-oversize resize)"
    elif it.get("capped"):
        size += " (downscaled by max_pixels)"
    pad = "-" if it["padding_pct"] is None else f"{it['padding_pct']:.1f} %"
    return [Path(it["input"]).name, size, patches, str(it["bucket"]), pad]


def human(console: Any, d: dict[str, Any]) -> None:
    from rich.table import Table

    from qwenvl_rbln.views.render import fmt_bytes, markup, one_line

    rt = d["runtime"]
    if d.get("placement"):
        where = f"LM on NPU {d['placement']['device']}, ViT on NPU {d['placement']['visual_device']}"
        if d.get("emulated"):
            where += ": emulated on the CPU by qvl, no NPU"
    else:
        where = f"{rt.get('device')}, {rt.get('dtype')}"
    console.print(
        markup(
            "[bold]qvl infer[/bold] {} [dim]({} backend, {}; preset {}; {})[/dim]",
            d["artifact_dir"],
            d["backend"],
            where,
            d["preset"],
            d["generation"]["mode"],
        )
    )
    for req in d["requests"]:
        if not req["streamed"]:
            console.print(markup("[bold][{}][/bold] {}", req["id"], req["text"]))
        ids = req["token_ids"]
        shown = " ".join(str(t) for t in ids[:16]) + (" ..." if len(ids) > 16 else "")
        console.print(
            markup("[dim][{}] {} tokens ({}): {}[/dim]", req["id"], len(ids), req["finish_reason"], shown),
            soft_wrap=True,
        )
    vis = [(req["id"], it) for req in d["requests"] for it in req["vision"]]
    if vis:
        t = Table(title=f"ViT buckets {d['vit_buckets']} (patches per ViT call)", title_justify="left", show_edge=False)
        for col in ("req", "input", "size -> resized", "patches", "bucket", "padding"):
            t.add_column(col, overflow="fold")
        for rid, it in vis:
            t.add_row(*[markup("{}", one_line(c)) for c in [rid, *_vision_row(it)]])
        console.print(t)
    by_batch: dict[int, list[dict[str, Any]]] = {}
    for req in d["requests"]:
        by_batch.setdefault(req["batch"], []).append(req)
    for b in d["batches"]:
        tm = b["timings"]
        reqs = by_batch.get(b["index"], [])
        prompt = ", ".join(
            f"{r['prefill']['tokens']} ({r['prefill']['chunks']} chunk{'s' if r['prefill']['chunks'] != 1 else ''})"
            for r in reqs
        )
        rate = "-" if tm["decode_tokens_per_s"] is None else f"{tm['decode_tokens_per_s']:.1f} tok/s"
        console.print(
            markup(f"[bold]batch {b['index']}[/bold] [{{}}]: ", ", ".join(b["request_ids"])),
            f"{b['decoder_graph']} with "
            f"{b['padded_rows']} padded row{'s' if b['padded_rows'] != 1 else ''} of {b['graph_batch']}; "
            f"prompt tokens {prompt}; preprocess {_fmt_s(tm['preprocess_s'])}, vision {_fmt_s(tm['vision_s'])}, "
            f"prefill {_fmt_s(tm['prefill_s'])}, TTFT {_fmt_s(tm['ttft_s'])}, decode {rate} "
            f"({tm['decode_steps']} steps)",
            sep="",
        )
        if b.get("vit"):
            console.print(vit_line(b["vit"]), markup=False, highlight=False)
    mem = d.get("memory") or {}
    if mem.get("peak_rss_bytes") is not None:
        line = f"memory: peak RSS {fmt_bytes(mem['peak_rss_bytes'])}"
        if mem.get("cuda_peak_allocated_bytes") is not None:
            line += f", CUDA peak {fmt_bytes(mem['cuda_peak_allocated_bytes'])}"
        console.print(line)
    elif mem.get("devices"):
        parts = [
            f"NPU {x['device']}: {fmt_bytes(x['total_bytes'])} of {fmt_bytes(x['usable_bytes'])}"
            for x in mem["devices"]
        ]
        console.print(f"memory ({mem.get('source')}): " + "; ".join(parts))
    tot = d["timings"]
    console.print(f"[dim]model load {_fmt_s(tot['load_s'])}, total {_fmt_s(tot['total_s'])}[/dim]")


def vit_line(vit: dict[str, Any]) -> str:
    """'  ViT: 3 graph calls for 8 segments (packed): 1024 [320+320+320, pad 64], ...' for one batch."""
    packs = [p for call in vit["visual_calls"] for p in call["packs"]]
    shown = ", ".join(f"{p['bucket']} [{'+'.join(map(str, p['lengths']))}, pad {p['padding']}]" for p in packs[:8])
    more = f", ... ({len(packs) - 8} more)" if len(packs) > 8 else ""
    how = "packed" if vit["packing"] else "unpacked: --no-vit-packing or runtime.vit_packing false"
    from qwenvl_rbln.views.render import plural

    calls, segments = plural(vit["graph_calls"], "graph call"), plural(vit["unpacked_calls"], "segment")
    return f"  ViT: {calls} for {segments} ({how}): {shown}{more}"


def register(app: typer.Typer) -> None:
    @app.command("infer")
    def infer(
        directory: Path = typer.Argument(
            None,
            metavar="DIR",
            help="Artifacts from `qvl compile` (or a Hugging Face Qwen3-VL directory); default: the directory the "
            "last `qvl compile` wrote (if deleted: its preset's output_dir); with --preset P: P's output_dir.",
            show_default=False,
        ),
        preset: str = typer.Option(
            None,
            "--preset",
            "-p",
            help="Preset (default: the one recorded in DIR's manifest, else rebel100-1npu). Without --preset and "
            "--set, a compiled DIR runs with its own batch size, decoder graphs, ViT buckets and pixel caps.",
        ),
        sets: list[str] = SetOpt,
        images: list[str] = typer.Option(None, "--image", "-i", help="Image file. Repeatable."),
        videos: list[str] = typer.Option(None, "--video", help="Video file (mp4, webm, ...). Repeatable."),
        prompt: str = typer.Option(None, "--prompt", help="The user prompt."),
        system: str = typer.Option(None, "--system", help="A system prompt (also the default for --batch-file)."),
        max_new_tokens: int = typer.Option(
            64,
            "--max-new-tokens",
            help="Tokens to generate at most; prompt + this must fit the compiled max_seq_len (refused otherwise).",
        ),
        temperature: float = typer.Option(
            None, "--temperature", help="Sample at this finite temperature >= 0 (default: greedy)."
        ),
        top_p: float = typer.Option(None, "--top-p", help="Nucleus sampling threshold in (0, 1] (with --temperature)."),
        seed: int = typer.Option(None, "--seed", help="Random seed for sampling (default 0)."),
        batch_file: Path = typer.Option(
            None,
            "--batch-file",
            help='JSONL, one request a line: {"id": ..., "prompt": ..., "images": [...], "video": ...}; batched up '
            "to the compiled batch_size. With --output: a streamed, resumable job.",
        ),
        output: Path = OutputOpt,
        resume: bool = ResumeOpt,
        workers: int = WorkersOpt,
        devices: str = DevicesOpt,
        ray_address: str = RayAddressOpt,
        device: str = typer.Option(
            None, "--device", help="rbln: NPU id for the LM graphs (default: the placement recorded at compile)."
        ),
        visual_device: str = typer.Option(None, "--visual-device", help="rbln: NPU id for the ViT."),
        on_oversize: str = typer.Option(
            None,
            "--on-oversize",
            help="An input above the largest ViT bucket: resize (cap the processor's max_pixels for that request "
            "only) or error. Default: the preset's runtime.on_oversize, else resize.",
        ),
        torch_device: str = typer.Option(
            None,
            "--torch-device",
            help="torch backend: cpu, cuda or cuda:N (default: $QVL_TORCH_DEVICE, else cuda when available, else cpu).",
        ),
        no_vit_packing: bool = typer.Option(
            False,
            "--no-vit-packing",
            help="rbln: one ViT call per image / video temporal patch, as optimum-rbln does (default: the segments "
            "of each ViT call packed into shared compiled calls; also off with the preset's runtime.vit_packing).",
        ),
        emulate: bool = typer.Option(
            False,
            "--emulate",
            help="Run an artifact compiled with `qvl compile --emulate` on qvl's CPU emulator of rebel (also "
            "QVL_EMULATE_NPU=1): optimum-rbln's real generate, emulated graphs.",
        ),
        as_json: bool = JsonOpt,
    ) -> None:
        """Generate text for images, videos and prompts; show buckets, decoder graphs, timings and memory."""
        from qwenvl_rbln.inference.runner import InferOptions, default_stream, run_infer
        from qwenvl_rbln.memory.placement import parse_device
        from qwenvl_rbln.views import live, render

        opts = InferOptions(
            directory=directory,
            preset=preset,
            sets=list(sets or []),
            images=list(images or []),
            videos=list(videos or []),
            prompt=prompt,
            system=system,
            batch_file=batch_file,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            device=parse_device(device, "--device"),
            visual_device=parse_device(visual_device, "--visual-device"),
            on_oversize=on_oversize,
            torch_device=torch_device,
            emulate=emulate,
            vit_packing=not no_vit_packing,
        )
        job = {"output": output, "resume": resume, "workers": workers, "devices": devices, "ray_address": ray_address}
        if any(value not in (None, False) for value in job.values()):  # --output: the streamed job
            return infer_batch.run_job(opts, as_json=as_json, **job)
        shown: set[str] = set()

        def notify(line: str) -> None:
            shown.add(line)
            render.warn(line)

        def on_batch(rows: list[dict[str, Any]], batch: dict[str, Any]) -> None:
            if as_json:
                return
            for row in rows:
                if not row["streamed"]:
                    render.out().print(f"[{row['id']}] {row['text']}", markup=False, highlight=False)
                    row["streamed"] = True  # printed: the summary does not repeat it

        with live.work_watch(as_json):  # requests and long video decodes, on a terminal only
            data = run_infer(opts, stream=default_stream(as_json), on_batch=on_batch, notify=notify)
        for line in data["warnings"]:
            if line not in shown:
                render.warn(line)
        render.emit(data, as_json=as_json, human=human)
