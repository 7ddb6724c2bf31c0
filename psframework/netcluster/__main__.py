"""python -m psframework.netcluster VERB ...: see psframework.netcluster.cli."""

import sys

from psframework.netcluster.cli import main

sys.exit(main())
