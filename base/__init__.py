"""The floor every room stands on: the project's one error root (``base.errors``)."""
