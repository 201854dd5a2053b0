"""``python -m proxy``: see ``proxy.server``."""

import sys

from proxy.server import main

sys.exit(main())
