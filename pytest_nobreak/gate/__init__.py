"""The CI gate: the baseline file, merging shards into one run, and atomic writes."""
