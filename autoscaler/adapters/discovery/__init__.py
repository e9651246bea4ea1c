"""Horovod host discovery: the overlay drain file (et-operator) and the owned file (standalone)."""
