"""Embedded stores: SQLite files in ``TALON_DATA_DIR``, served off the event loop."""
