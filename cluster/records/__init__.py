"""What a run leaves in the runs folder and its store, read back: its record and log, the list of runs, status,
retry-failed and a run's provider batches."""
