"""What a run reports: metrics files, the progress line, the start summary, units and FLOPs."""
