"""The long-running daemon: wires observers, sources and actuators to the reconciler."""
