"""The Delta log: listing, reading commits and checkpoints, snapshots, finding the next commit, watching."""
