"""`python -m autoscaler.cli`: the `spot-autoscaler` command."""

import sys

from autoscaler.cli import main

if __name__ == "__main__":  # the lease renewer, spawned, imports this module again
    sys.exit(main())
