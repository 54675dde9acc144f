"""The PostgreSQL stores (``TALON_DATABASE_URL``): an async pool, the schema, one module per store."""
