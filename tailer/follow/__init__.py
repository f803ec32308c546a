"""Following a table: the follow loop, its checkpoints and state directory, retries, status and figures."""
