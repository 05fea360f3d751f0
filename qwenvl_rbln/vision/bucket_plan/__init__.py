"""The bucket-plan report as data: per-input items, per-bucket costs and summaries, optimised buckets."""
