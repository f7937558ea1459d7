"""The statements of `workflows/queries.sql` by name, loaded once for the modules that run them (the
queue's, and the reads of the run tables)."""

from __future__ import annotations

from eventstore.spi import load_queries

Q = load_queries("workflows")
