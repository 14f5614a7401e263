"""``python -m commlib.bench``: the same as the ``commlib-bench`` console script."""

import sys

from .cli import main

sys.exit(main())
