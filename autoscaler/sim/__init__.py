"""Replaying spot availability through the real core, with no cluster and no cloud."""
