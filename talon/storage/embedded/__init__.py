"""The embedded stores (the default, no server): SQLite through ``SqliteRunner``, JSONL and files
in ``TALON_DATA_DIR``, their blocking work off the event loop."""
