"""deltatail's IO and orchestration: storage, log listing and watching, checkpoints, rows, the run loop, the CLI."""
