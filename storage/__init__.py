"""storage room."""
