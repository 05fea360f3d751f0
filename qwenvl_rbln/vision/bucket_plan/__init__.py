"""The ``qvl bucket-plan`` report as data: a script or a test can call it without a console.

- ``items``: one planned item per input (image, video, workload line): resize, patches, bucket, ViT calls.
- ``report``: summaries, the workload plan, flag checks, the memory gate, the closing error.
- ``optimise``: optimised ViT bucket lists and ``decoder_batch_sizes``.
"""
