"""``python -m tailer.cli``: the ``deltatail`` command."""

import sys

from tailer.cli.main import main

sys.exit(main())
