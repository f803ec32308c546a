"""The ``deltatail`` command: the composition root, where settings become configs and a sink URI becomes a sink."""
