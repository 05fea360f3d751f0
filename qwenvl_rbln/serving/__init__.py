"""The vllm-rbln hand-off: preflight a compiled artifact, then build ``vllm serve`` / ``vllm bench serve`` as data.

vllm-rbln (the vLLM plugin for RBLN NPUs) treats a directory holding ``rbln_config.json`` as a precompiled
optimum-rbln artifact. It silently overwrites several flags with the compiled values and fails late, and
cryptically, on the rest (facts: ``shared/reference/vllm-rbln-serving.md``, ``shared/engine/README.md``). So qvl
checks the artifact and the flags first and hands over a command that is right the first time. It never imports
vllm: this package returns ``Launch`` data (argv, the environment variables qvl sets, the checks that passed);
``commands/serve_cmd.py`` prints it, execs it, or (``--emulate``) runs it as a labelled child over the emulated NPU.

Device ids given to qvl (``--device``, ``--visual-device``, the compiled placement) are physical NPU ids, as
``rbln-smi`` lists them. qvl sets the device variable of the vllm-rbln generation at hand (``engine``:
``RBLN_DEVICES`` for 0.11, ``RBLN_VISIBLE_DEVICES`` for 0.12+) to exactly those devices, and the runtime, like
``CUDA_VISIBLE_DEVICES`` for vLLM on GPUs, numbers the visible devices from 0: the ids in the placement flag
(``--additional-config`` or ``--rbln-optimum-overrides``) are positions in that list (the same numbers whenever the
devices are 0..n-1).

- ``options``: the options of both commands, the checked ``Artifact``, the ``Launch`` data, the names vLLM and the
  packing plugin agree on.
- ``preflight``: the checks on the artifact directory.
- ``flags``: the pass-through flags after ``--``, parsed and checked against the artifact.
- ``command``: ``vllm serve``: the directory, the placement, the multimodal limits, the environment.
- ``bench``: ``vllm bench serve`` with images sized to the compiled ViT buckets.
- ``engine``: which vllm-rbln the line is for, and its generation's placement flag and device variable.
- ``launch``: finding the ``vllm`` executable; ``port``: refusing a port another server listens on.
- ``public_routes``, ``key_guard``: who may call: the routes that answer without the API key (one list, no vLLM
  import, for every front door) and the ASGI middleware on every serve line that requires the key on all others.
- ``emulated``, ``emulated_http``, ``supervise``: ``--emulate`` (its environment, the header on every answer, vLLM as
  a labelled child whose whole process group ends with qvl).
- ``vllm_plugin``, ``decode_sort``: serving's half of the vLLM plugin (the per-frame video cap, the decode batch
  sort, the switches ``qvl serve`` sets); the ``vllm.general_plugins`` entry point that also installs the packed ViT
  forward is ``qwenvl_rbln/vllm_plugin.py``.
"""
