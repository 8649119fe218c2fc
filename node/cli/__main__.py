"""``python -m node.cli`` is ``ai-memory``."""

import sys

from node.cli import main

sys.exit(main())
