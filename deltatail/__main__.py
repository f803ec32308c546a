"""``python -m deltatail``: the command line."""

import sys

from deltatail import main

sys.exit(main())
