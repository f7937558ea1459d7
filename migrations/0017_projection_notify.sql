-- Reading one's own writes: every advance of a projection's durable cursor wakes whoever waits for it
-- (projector.wait_for, the API's min_cursor). The NOTIFY is sent when the batch's transaction commits, so
-- a waiter that wakes reads a cursor whose table changes are already visible; a batch that rolls back
-- sends nothing. The payload is the projection's name: waiters read the cursor row itself.
-- One NOTIFY per projector batch (not per event); appenders are untouched.
CREATE FUNCTION ledgerflow.notify_projection_advanced() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ledgerflow_projections', NEW.projection);
    RETURN NULL;
END
$$;

CREATE TRIGGER projection_cursor_advanced
 AFTER UPDATE OF cursor_tx, cursor_position ON ledgerflow.projection_cursors
   FOR EACH ROW
  WHEN (OLD.cursor_tx IS DISTINCT FROM NEW.cursor_tx OR OLD.cursor_position IS DISTINCT FROM NEW.cursor_position)
EXECUTE FUNCTION ledgerflow.notify_projection_advanced();
