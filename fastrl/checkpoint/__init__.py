"""Checkpoints: atomic publication, latest marker, exact-resume train state, signals."""
