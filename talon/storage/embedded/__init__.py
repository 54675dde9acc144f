"""The embedded stores (the default, no server): SQLite through ``SqliteRunner``, JSONL and files,
their blocking work off the event loop."""
