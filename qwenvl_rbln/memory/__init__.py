"""Memory planner: will ViT + LM + KV cache fit on each NPU, decided from the plan alone, with honest margins.

Per device, the items below are summed and compared with the usable DRAM (docs/memory-model.md):

* ``lm.weights``        exact: decoder layers + final norm + lm_head (the token embedding stays on the host);
                        with ``quantization``, the q/k/v/o/gate/up/down weights at 8 or 4 bits + fp32 scales and
                        the rest in fp32 (optimum-rbln loads quantized models in float32)
* ``lm.kv_cache``       exact for a given block count: 2 x layers tensors [blocks, kv_heads, block, head_dim],
                        each aligned up to 2 MiB (fp8 KV: 1 byte); the block count is what optimum-rbln 0.12 chooses
* ``lm.attention_mask`` exact (``use_attention_mask``): the prefill [1, 1, chunk, max_seq_len] and decoder
                        [B, 1, 1, max_seq_len] mask inputs
* ``lm.workspace``      modelled: activations of the prefill graph and of every decoder graph
* ``visual.weights``    exact: ViT blocks + merger + deepstack mergers (patch/pos embeddings stay on the host)
* ``visual.workspace``  modelled: attention over the largest bucket S, ~(heads x (4 + 2) + 2 x 2) x S^2 bytes

Every modelled item has a low / high range besides its estimate. The planner runs three scenarios (every
modelled item at its low end, at its estimate, at its high end; automatic KV sizing re-run in each) and a
device's verdict is ``fits`` when it fits in all three, ``does_not_fit`` when it fits in none, ``uncertain``
otherwise. A configuration the product document observed keeps the observed verdict and cites it.

Automatic KV sizing (flash attention, ``kvcache_num_blocks`` 0) is modelled the way optimum-rbln 0.12
does it: after compiling the LM *alone*, against the nominal DRAM of one device (x ``memory_budget``),
fullest chiplet deciding. The ViT that shares the card is not counted there, which is why a shared card
can be filled by the KV pool and the ViT then fails to load.

Pure Python: no torch, no transformers.

The modules, in the order they build on each other:

* ``params``       exact parameter counts of the LM and the ViT, the dtype sizes of their weights
* ``workspaces``   the modelled LM graph and ViT workspaces (formulas, ranges, bucket-plan's per-bucket figure)
* ``report``       MemoryItem, DeviceMemory, MemoryReport, the verdict names, the assumptions, --device-memory
* ``context``      the context one scenario runs in (geometry, NPU, usable bytes, dtype, scenario)
* ``kv``           KV tensor bytes and alignment, the block count optimum-rbln ends up with
* ``items``        the items of one scenario (weights, KV, workspaces, attention mask) and each device's copies
* ``chiplets``     how a device's items spread over its chiplets
* ``estimate``     one scenario per device, the three scenarios folded into verdicts, the observed cases
* ``suggestions``  fixes found by re-running the estimate on changed settings
* ``verdicts``     the memory gate: verdict, stop or go, the one-line reason and fix
* ``planner``      the entry points ``estimate`` and ``estimate_plan``
* ``calibration``  measured workspaces from ``qvl load-check``; ``placement`` the device placement checks
"""
