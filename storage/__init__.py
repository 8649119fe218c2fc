"""storage room: the SQLite database (schema, migrations, group-commit writer) and one module per table family.

The only place in attested-mesh that writes SQL. Imports nothing from node/ or mesh/.
"""

from storage.db import Database
from storage.errors import StorageError
from storage.migrations import MAX_SUPPORTED_SCHEMA

__all__ = ["Database", "StorageError", "MAX_SUPPORTED_SCHEMA"]
