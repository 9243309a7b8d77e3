-- stile schema, version 5: each partition's row keeps its queue's dedup
-- window, so that the push reads the window from the row it locks, with the
-- allocator, instead of joining stile.queues for every segment.
--
-- stile.queues stays the authority: two triggers keep every copy equal to it,
-- whoever writes the queue (stile.configure of any build, or plain SQL).
--   * A partition takes its queue's window when it is created, read FOR
--     SHARE: a configure that changes the window holds the queue's row lock
--     until it commits, so a creation beside it reads the window it commits.
--   * A change of a queue's window is copied to each of its partitions in the
--     same transaction, their row locks taken in ascending id order (the one
--     global lock order, see host/sql/functions/partitions.sql). A push holds
--     its partitions' locks while it decides, so it decides under one window:
--     the one before the change or the one after.
-- A copy shorter than the queue's window would let an in-window duplicate
-- through, which is why no path may write one without the other.

-- Serialises this migration against queue writers: none commits a window
-- between the copy below and the triggers taking over.
LOCK TABLE stile.queues IN SHARE MODE;

ALTER TABLE stile.partitions ADD COLUMN dedup_window_seconds integer;
UPDATE stile.partitions p
   SET dedup_window_seconds = q.dedup_window_seconds
  FROM stile.queues q
 WHERE q.name = p.queue;
ALTER TABLE stile.partitions ALTER COLUMN dedup_window_seconds SET NOT NULL;

-- A new partition's window, from its queue.
CREATE FUNCTION stile.partition_takes_queue_window()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    SELECT q.dedup_window_seconds INTO NEW.dedup_window_seconds
      FROM stile.queues q
     WHERE q.name = NEW.queue
       FOR SHARE;
    RETURN NEW;
END
$$;

CREATE TRIGGER partition_takes_queue_window
    BEFORE INSERT ON stile.partitions
    FOR EACH ROW EXECUTE FUNCTION stile.partition_takes_queue_window();

-- A queue's new window, to each of its partitions.
CREATE FUNCTION stile.queue_window_to_partitions()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM 1
       FROM stile.partitions p
      WHERE p.queue = NEW.name
      ORDER BY p.id
        FOR NO KEY UPDATE;
    UPDATE stile.partitions p
       SET dedup_window_seconds = NEW.dedup_window_seconds
     WHERE p.queue = NEW.name;
    RETURN NULL;
END
$$;

CREATE TRIGGER queue_window_to_partitions
    AFTER UPDATE OF dedup_window_seconds ON stile.queues
    FOR EACH ROW
    WHEN (OLD.dedup_window_seconds IS DISTINCT FROM NEW.dedup_window_seconds)
    EXECUTE FUNCTION stile.queue_window_to_partitions();
