"""Vision: patch geometry, ViT buckets, packing, media headers, workloads and the bucket-plan report."""
