"""spot-autoscaler: elastic Horovod on spot GPUs, driven by cost policies."""

__version__ = "0.1.0"
