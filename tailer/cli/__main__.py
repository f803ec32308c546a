"""``python -m tailer.cli``: the ``deltatail`` command."""

import sys

from deltatail.tailer.cli.main import main

sys.exit(main())
