"""Many tables in one process: the service behind ``deltatail serve``, its state root, metrics and health."""
