"""Sweeps: a prompt set recorded against several configurations on Ray, and read back as one dataset."""
