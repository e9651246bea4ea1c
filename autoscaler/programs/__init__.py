"""The programs besides the daemon, each a `spot-autoscaler` subcommand run as its own process:
the node agent (a DaemonSet: instance metadata -> a notice on its Node) and the launcher pod's
discovery sidecar (the drained hosts -> the drain file; the scripts it installs). They parse
their arguments and wire adapters; the adapters do the I/O."""
