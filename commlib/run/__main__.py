"""``python -m commlib.run``: the same as ``commlib-run``."""

import sys

from .launch import main

sys.exit(main())
