"""``python -m tailer.cli``: the ``deltatail`` command (as ``python -m deltatail``, Arrow's pool named first)."""

import sys

from deltatail.tailer.cli.process import name_arrow_pool

name_arrow_pool()  # before the command line loads Arrow

from deltatail.tailer.cli.main import main  # noqa: E402  (after the pool is named)

sys.exit(main())
