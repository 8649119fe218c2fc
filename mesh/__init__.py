"""mesh room."""
