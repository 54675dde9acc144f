"""Embedded stores: SQLite files in ``TALON_DATA_DIR``, each served by a ``SqliteRunner``."""
