"""``python -m nestflex.deploy``: the ``nestflex`` command without the console script."""

import sys

from nestflex.deploy.cli import main

sys.exit(main())
