"""`python -m autoscaler.cli`: the `spot-autoscaler` command."""

import sys

from autoscaler.cli import main

sys.exit(main())
