"""``python -m nestflex``: the ``nestflex`` command without the console script."""

import sys

from nestflex.cli import main

sys.exit(main())
