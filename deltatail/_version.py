"""deltatail's version, the one place it is written.

``pyproject.toml`` reads it for the distribution's metadata (``dynamic = ["version"]``, setuptools'
``attr:``, read without importing), ``deltatail.__version__`` and ``deltatail --version`` print it.
A constant, so that the version costs nothing to import: ``importlib.metadata`` would load the
``email`` package and scan the installed distributions at every start of the command.
"""

__version__ = "0.1.0"
