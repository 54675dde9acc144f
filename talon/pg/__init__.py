"""PostgreSQL implementations of Talon's stores, chosen by ``TALON_DATABASE_URL`` (see
``talon.stores``): many workers share one database."""
