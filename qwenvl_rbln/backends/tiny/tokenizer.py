"""The tiny model's tokenizer: a byte-level BPE trained in-process on a fixed corpus, wrapped in Qwen2Tokenizer.

Its own module because the vocabulary (and so every token id the tiny model reads or writes) depends only on
what is here: the added tokens in Qwen's order, the pre-tokenizer regex, the embedded training text and the
Qwen3-VL chat template. Heavy imports (transformers, tokenizers) happen inside functions only.
"""

from __future__ import annotations

from typing import Any

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

# model_max_length of the shipped Qwen3-VL tokenizer_config.json.
MODEL_MAX_LENGTH = 262144


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
