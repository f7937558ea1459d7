-- The event type catalogue's counts (projector/type_catalogue.py).

-- name: catalogue_exists
SELECT to_regclass('ledgerflow.event_type_catalogue') IS NOT NULL

-- name: type_counts
-- A few rows per type: the catalogue's primary key leads with the tenant, and a server-wide listing
-- reads the whole (small) table.
SELECT event_type, schema_version, sum(events)::bigint
  FROM ledgerflow.event_type_catalogue
 WHERE %(tenant)s::text IS NULL OR tenant = %(tenant)s
 GROUP BY event_type, schema_version
 ORDER BY event_type, schema_version
