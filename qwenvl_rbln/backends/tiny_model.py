"""A tiny Qwen3-VL with the real architecture and random weights, built entirely offline.

Why: every code path of qvl (processor, vision tower, deepstack, M-RoPE, generate) can be
exercised on a laptop CPU in seconds, without the hub and without multi-GB checkpoints.
The generated text is meaningless; a ``qvl_tiny_model.json`` marker in the directory says so,
so commands can warn the user.

Heavy imports (torch, transformers, tokenizers) happen inside functions only.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from qwenvl_rbln.errors import BackendError, DependencyMissing, InputError
from qwenvl_rbln.paths import user_path
from qwenvl_rbln.planning.modelinfo import tiny_model_dir

MARKER_FILE = "qvl_tiny_model.json"
MARKER_NOTE = "random weights; generated text is meaningless"
# Bump when the layout/dims change so cached copies from an older qvl are rebuilt.
FORMAT_VERSION = 1
DEFAULT_DIR_NAME = "tiny-qwen3-vl"

# Qwen2/Qwen3 added tokens, in the real order (real ids start at 151643; here they follow the BPE vocab).
# (token, special): the first 14 are special, the tool/fim/think tokens are plain added tokens.
QWEN_ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]

# Vocabulary: 256 byte tokens + BPE merges + the added tokens above = exactly VOCAB_SIZE.
VOCAB_SIZE = 512
BPE_VOCAB_SIZE = VOCAB_SIZE - len(QWEN_ADDED_TOKENS)

# Qwen2's pre-tokenizer regex (same as transformers' Qwen2Tokenizer), so our BPE splits text the
# same way whichever class AutoTokenizer picks.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)

# Fixed training text for the BPE: words that show up in vision-language prompts, plus the
# "<1.5 seconds>" timestamps Qwen3VLProcessor writes into video prompts.
_CORPUS = """\
You are a helpful assistant. Describe this image. Describe this video. What is in the picture?
What happens in the video? Answer the question in one sentence. Please describe the scene in detail.
The image shows a cat sitting on a red chair next to a window. The video shows a person walking
through a park with a dog. There are two people, three cars, and a tree in the background.
The sky is blue and the grass is green. A small white boat floats on the lake at sunset.
Read the text in the image. Count the objects. Where is the ball? Which color is the car?
The chart shows sales for each month of the year: January, February, March, April, May, June.
The first frame shows a kitchen; the last frame shows a living room. The man opens the door.
<0.5 seconds> <1.0 seconds> <1.5 seconds> <2.0 seconds> <2.5 seconds> <3.0 seconds> <4.0 seconds>
Picture 1: Picture 2: Video 1: Video 2: user assistant system tool function arguments name
def main(): return 0  # numbers 0 1 2 3 4 5 6 7 8 9 10 16 32 64 128 256 512 1024 2048
"""

# Qwen3-VL (Instruct) chat template, as shipped in Qwen/Qwen3-VL-*-Instruct chat_template.json
# (Apache-2.0): optional tools block, no default system prompt, image/video/text content parts.
QWEN3_VL_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' }}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content_item in message.content %}
                {%- if 'text' in content_item %}
                    {{- content_item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and message.content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""  # noqa: E501

# Model dimensions: the real Qwen3-VL layout, shrunk. mrope_section sums to head_dim // 2 and keeps
# the real T>H=W split ([24, 20, 20] for head_dim 128).
TEXT_DIMS: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "rope_theta": 5_000_000.0,
    "mrope_section": [4, 2, 2],
}
VISION_DIMS: dict[str, Any] = {
    "depth": 3,
    "hidden_size": 64,
    "hidden_act": "gelu_pytorch_tanh",
    "intermediate_size": 128,
    "num_heads": 4,
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 2304,
    "deepstack_visual_indexes": [0, 1, 2],
}
# Same processor settings as the shipped Qwen3-VL preprocessor_config.json / video_preprocessor_config.json.
IMAGE_SIZE = {"shortest_edge": 65536, "longest_edge": 16777216}
VIDEO_SIZE = {"shortest_edge": 4096, "longest_edge": 25165824}
MODEL_MAX_LENGTH = 262144
# Weight init std: 1/sqrt(hidden) (unit-gain layers) instead of the usual 0.02. At 0.02 a tiny model
# with tied embeddings just echoes its last prompt token forever, whatever the image; at unit gain the
# greedy output depends on the image and the prompt, which backend-vs-backend comparisons need.
INIT_RANGE = 0.125


def default_tiny_model_dir() -> Path:
    """The shared tiny model location, so every command and test reuses one copy."""
    return tiny_model_dir()


def read_marker(path: Path) -> dict[str, Any] | None:
    """The tiny-model marker of ``path``, or None when ``path`` is not a qvl tiny model."""
    try:
        data = json.loads((Path(path) / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("qvl_tiny_model") is True else None


def is_tiny_model(path: Path) -> bool:
    """True when ``path`` was written by :func:`create_tiny_model` (so its output is meaningless)."""
    return read_marker(path) is not None


def _is_complete(path: Path) -> bool:
    marker = read_marker(path)
    return (
        marker is not None
        and marker.get("format") == FORMAT_VERSION
        and (path / "config.json").is_file()
        and (path / "model.safetensors").is_file()
    )


def _require_heavy() -> None:
    missing = []
    for name in ("torch", "transformers", "tokenizers"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise DependencyMissing(
            f"the tiny model needs {', '.join(missing)}, which is not installed",
            "pip install torch torchvision transformers tokenizers",
        )


def _bytes_to_unicode() -> list[str]:
    """GPT-2/Qwen byte-level alphabet, in vocab order (printable bytes first, like Qwen's ids 0-255)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def _pre_tokenizer() -> Any:
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _train_bpe(corpus: str, vocab_size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A plain-Python byte-level BPE: deterministic by construction (ties broken by the pair itself)."""
    import unicodedata
    from collections import Counter

    pre = _pre_tokenizer()
    words = Counter(w for w, _ in pre.pre_tokenize_str(unicodedata.normalize("NFC", corpus)))
    splits = {w: list(w) for w in words}
    vocab = {tok: i for i, tok in enumerate(_bytes_to_unicode())}
    merges: list[tuple[str, str]] = []
    while len(vocab) < vocab_size:
        pairs: Counter[tuple[str, str]] = Counter()
        for w, n in words.items():
            parts = splits[w]
            for a, b in zip(parts, parts[1:], strict=False):
                pairs[(a, b)] += n
        if not pairs:
            raise RuntimeError("tiny-model BPE corpus too small for the requested vocab size")
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        merges.append(best)
        merged = best[0] + best[1]
        if merged not in vocab:
            vocab[merged] = len(vocab)
        for w, parts in splits.items():
            i, out = 0, []
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            splits[w] = out
    return vocab, merges


def build_tokenizer() -> Any:
    """Qwen2Tokenizer (what AutoTokenizer picks for qwen3_vl) over a small in-process BPE vocab."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    vocab, merges = _train_bpe(_CORPUS, BPE_VOCAB_SIZE)
    special = [tok for tok, is_special in QWEN_ADDED_TOKENS if is_special]
    # No special tokens at construction: Qwen2Tokenizer would add them in its own order. We add all
    # of them in the real order so ids are contiguous (first added token = BPE_VOCAB_SIZE), then name them.
    tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token=None,
        pad_token=None,
        model_max_length=MODEL_MAX_LENGTH,
        errors="replace",
        split_special_tokens=False,
        clean_up_tokenization_spaces=False,
    )
    tok.add_tokens([AddedToken(t, special=s, normalized=not s) for t, s in QWEN_ADDED_TOKENS])
    tok.add_special_tokens(
        {
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "extra_special_tokens": [t for t in special if t not in ("<|endoftext|>", "<|im_end|>")],
        }
    )
    tok.chat_template = QWEN3_VL_CHAT_TEMPLATE
    ids = tok.convert_tokens_to_ids([t for t, _ in QWEN_ADDED_TOKENS])
    expected = list(range(BPE_VOCAB_SIZE, BPE_VOCAB_SIZE + len(QWEN_ADDED_TOKENS)))
    if ids != expected or len(tok) != VOCAB_SIZE:
        raise RuntimeError(f"tiny tokenizer ids are off: {ids} (len {len(tok)}), expected {expected}")
    return tok


def build_config(tokenizer: Any) -> Any:
    """Qwen3VLConfig with the tiny dims and token ids taken from ``tokenizer``."""
    from transformers import Qwen3VLConfig

    names = [t for t, _ in QWEN_ADDED_TOKENS]
    ids = dict(zip(names, tokenizer.convert_tokens_to_ids(names), strict=True))
    t = TEXT_DIMS
    text_config = {
        "vocab_size": VOCAB_SIZE,
        **{k: v for k, v in t.items() if k not in ("rope_theta", "mrope_section")},
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": t["rope_theta"],
            "mrope_section": list(t["mrope_section"]),
            "mrope_interleaved": True,
        },
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": INIT_RANGE,
        "use_cache": True,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "tie_word_embeddings": True,
        "dtype": "float32",
    }
    vision_config = {**VISION_DIMS, "out_hidden_size": t["hidden_size"], "initializer_range": INIT_RANGE}
    config = Qwen3VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    config.architectures = ["Qwen3VLForConditionalGeneration"]
    config.dtype = "float32"
    return config


def build_processor(tokenizer: Any) -> Any:
    """Qwen3VLProcessor with the shipped Qwen3-VL image/video settings and the real chat template."""
    from transformers import Qwen3VLProcessor, Qwen3VLVideoProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    common = {
        "patch_size": VISION_DIMS["patch_size"],
        "temporal_patch_size": VISION_DIMS["temporal_patch_size"],
        "merge_size": VISION_DIMS["spatial_merge_size"],
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_convert_rgb": True,
    }
    image_processor = Qwen2VLImageProcessor(size=dict(IMAGE_SIZE), **common)
    video_processor = Qwen3VLVideoProcessor(
        size=dict(VIDEO_SIZE), fps=2, min_frames=4, max_frames=768, do_sample_frames=True, **common
    )
    return Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=QWEN3_VL_CHAT_TEMPLATE,
    )


def _generation_config(tokenizer: Any) -> Any:
    """The shipped Qwen3-VL Instruct sampling defaults; callers wanting greedy pass do_sample=False."""
    from transformers import GenerationConfig

    eos, im_end = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    return GenerationConfig(
        bos_token_id=eos,
        pad_token_id=eos,
        eos_token_id=[im_end, eos],
        do_sample=True,
        top_k=20,
        top_p=0.8,
        temperature=0.7,
        repetition_penalty=1.0,
    )


def _add_legacy_rope_keys(config_path: Path) -> None:
    """Also spell RoPE the way the shipped checkpoints (and transformers < 5) do.

    transformers 5 writes ``rope_parameters``; Hub checkpoints carry ``rope_scaling`` + ``rope_theta``,
    which 5.x still reads (to the same values). Writing both keeps the tiny model readable by
    4.x-era tooling such as optimum-rbln.
    """
    data = json.loads(config_path.read_text(encoding="utf-8"))
    text = data["text_config"]
    rope = text["rope_parameters"]
    text["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    text["rope_theta"] = rope["rope_theta"]
    config_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _write_model(tmp: Path, seed: int) -> None:
    import torch
    from transformers import Qwen3VLForConditionalGeneration
    from transformers.utils import logging as hf_logging

    tokenizer = build_tokenizer()
    config = build_config(tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3VLForConditionalGeneration(config).to(torch.float32).eval()
    model.generation_config = _generation_config(tokenizer)
    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Writing model shards" bar on stderr for a 3 MB file
    try:
        model.save_pretrained(tmp)
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()
    _add_legacy_rope_keys(tmp / "config.json")
    build_processor(tokenizer).save_pretrained(tmp)
    marker = {
        "qvl_tiny_model": True,
        "seed": seed,
        "note": MARKER_NOTE,
        "format": FORMAT_VERSION,
        "dtype": "float32",
        "vocab_size": VOCAB_SIZE,
    }
    (tmp / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    for f in tmp.iterdir():
        f.chmod(0o644)  # safetensors writes 0600; a shared cache should be readable by others


def _non_empty_dir(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


_WRITE_FAILED = {errno.ENOSPC, errno.EDQUOT, errno.EIO}


@contextlib.contextmanager
def _writing(target: Path):
    """An OSError while building the tiny model becomes one line naming the path (exit 2 for a place that
    cannot be written, exit 5 for a full disk or an I/O error); the temp directory is cleaned by the caller."""
    try:
        yield
    except OSError as exc:
        what = exc.strerror or type(exc).__name__
        where = exc.filename or target
        message = f"cannot write the tiny model to {target}: {what} ({where}); nothing half-written was left"
        if exc.errno in _WRITE_FAILED:
            raise BackendError(message, "free space on that filesystem, or pass another directory") from None
        raise InputError(message, "pass a directory you can write (qvl tiny-model DIR), or set QVL_HOME") from None
    except Exception as exc:
        if type(exc).__name__ != "SafetensorError":  # safetensors reports a full disk as its own error type
            raise
        detail = " ".join(str(exc).split())[:300]
        raise BackendError(
            f"cannot write the tiny model to {target}: {detail}; nothing half-written was left",
            "free space on that filesystem, or pass another directory",
        ) from None


def _raced(out_dir: Path) -> InputError:
    return InputError(
        f"tiny model target {out_dir} was created by another process while this one was writing",
        "use ensure_tiny_model() for shared locations, or pass overwrite=True (qvl tiny-model --force)",
    )


def create_tiny_model(out_dir: Path, *, seed: int = 0, overwrite: bool = False) -> Path:
    """Write the tiny model to ``out_dir`` atomically (temp sibling + rename); return the path.

    Refuses to replace an existing non-empty directory unless ``overwrite``, so a typo never
    wipes a real checkpoint.
    """
    out_dir = user_path(out_dir).absolute()
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"tiny model target {out_dir} exists and is not a directory", "pick another path")
    if _non_empty_dir(out_dir) and not is_tiny_model(out_dir):  # --force replaces a tiny model, nothing else
        raise _not_a_tiny_model(out_dir)
    if _non_empty_dir(out_dir) and not overwrite:
        raise InputError(
            f"tiny model target {out_dir} already holds a tiny model",
            "pass overwrite=True (qvl tiny-model --force) to replace it, or pick another directory",
        )
    _require_heavy()
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{tag}"
    old = out_dir.parent / f".{out_dir.name}.old-{tag}"
    with _writing(out_dir):
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(out_dir, tmp, old, seed, overwrite)
    return out_dir


def _write_atomically(out_dir: Path, tmp: Path, old: Path, seed: int, overwrite: bool) -> None:
    """Build in ``tmp``, then swap it in (the old directory, if any, goes to ``old`` and is removed)."""
    try:
        tmp.mkdir()
        _write_model(tmp, seed)
        if out_dir.is_dir() and not _non_empty_dir(out_dir):
            out_dir.rmdir()
        elif out_dir.exists():
            if not overwrite:  # appeared while we were writing
                raise _raced(out_dir)
            os.replace(out_dir, old)
        try:
            os.replace(tmp, out_dir)
        except OSError as exc:  # someone else's directory landed first
            if old.exists() and not out_dir.exists():
                os.replace(old, out_dir)  # put the previous one back
            raise _raced(out_dir) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def _not_a_tiny_model(target: Path) -> InputError:
    return InputError(
        f"{target} exists and is not a qvl tiny model; it was left untouched",
        "pass another directory, or remove that one yourself if you mean to",
    )


def ensure_tiny_model(path: Path | None = None, *, seed: int = 0) -> Path:
    """Return a ready tiny model at ``path`` (default: :func:`default_tiny_model_dir`), creating it once.

    A file lock next to the directory serialises concurrent callers: the first builds it, the
    others wait and reuse the result. ``seed`` only matters when the model has to be built.
    """
    target = user_path(path).absolute() if path is not None else default_tiny_model_dir()
    if _is_complete(target):
        return target
    if _non_empty_dir(target) and not is_tiny_model(target):
        raise _not_a_tiny_model(target)
    _require_heavy()  # filelock comes with transformers (via huggingface_hub)
    from filelock import FileLock

    with _writing(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(target.parent / f".{target.name}.lock"), timeout=600)
        lock.acquire()
    try:
        if not _is_complete(target):
            if _non_empty_dir(target) and not is_tiny_model(target):
                raise _not_a_tiny_model(target)
            # an older-format or half-written qvl tiny model is ours to replace
            create_tiny_model(target, seed=seed, overwrite=True)
    finally:
        lock.release()
    return target


def describe(path: Path) -> dict[str, Any]:
    """Files and sizes of a tiny model directory, for the CLI and reports."""
    path = Path(path)
    files = {p.name: p.stat().st_size for p in sorted(path.iterdir()) if p.is_file()}
    return {
        "path": str(path),
        "marker": read_marker(path),
        "files": files,
        "total_bytes": sum(files.values()),
    }


def build_or_reuse(directory: Path | None, *, seed: int = 0, force: bool = False, notify: Any = None) -> dict[str, Any]:
    """`qvl tiny-model`: reuse DIR when it already holds this seed's model in this format (unless ``force``),
    else build it (``notify(line)`` hears that first); returns what was done, for the renderer."""
    import time

    target = user_path(directory if directory is not None else default_tiny_model_dir(), "directory").absolute()
    marker = read_marker(target)
    reuse = (
        not force
        and marker is not None
        and marker.get("seed") == seed
        and marker.get("format") == FORMAT_VERSION
        and (target / "model.safetensors").is_file()
    )
    start = time.perf_counter()
    if not reuse:
        if notify is not None:
            notify(f"building tiny Qwen3-VL in {target} ...")
        create_tiny_model(target, seed=seed, overwrite=force)
    info = describe(target)
    return {
        "path": str(target),
        "created": not reuse,
        "seed": seed,
        "seconds": round(time.perf_counter() - start, 3),
        "total_bytes": info["total_bytes"],
        "files": info["files"],
        "note": MARKER_NOTE,
    }
