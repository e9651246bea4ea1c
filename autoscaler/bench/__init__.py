"""`spot-autoscaler bench`: the autoscaler against baselines and an oracle on a spot trace."""
