"""testbed room."""
