"""a2a room."""
