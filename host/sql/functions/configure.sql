------------------------------------------------------------------------------
-- Configure
------------------------------------------------------------------------------

-- The options a queue is created with, camelCase as Queen's clients send
-- them: stile's two (dedupWindowSeconds, retentionSeconds) and Queen's.
CREATE OR REPLACE FUNCTION stile.option_defaults()
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT '{"dedupWindowSeconds": 3600, "retentionSeconds": 0, "leaseTime": 300,
             "retryLimit": 3, "priority": 0, "delayedProcessing": 0, "windowBuffer": 0,
             "maxSize": 10000, "completedRetentionSeconds": 0, "encryptionEnabled": false,
             "namespace": null, "task": null}'::jsonb
$$;

-- A queue's stored options, as stile.configure returns them; NULL for a
-- queue that does not exist. It takes the queue's name, not a row of
-- stile.queues: a distributed database (Citus) cannot call a function taking
-- a distributed or reference table's row type on its nodes.
CREATE OR REPLACE FUNCTION stile.queue_options_of(p_queue text)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN (SELECT jsonb_build_object(
                       'dedupWindowSeconds', q.dedup_window_seconds,
                       'retentionSeconds', q.retention_seconds,
                       'leaseTime', q.lease_time,
                       'retryLimit', q.retry_limit,
                       'priority', q.priority,
                       'delayedProcessing', q.delayed_processing,
                       'windowBuffer', q.window_buffer,
                       'maxSize', q.max_size,
                       'completedRetentionSeconds', q.completed_retention_seconds,
                       'encryptionEnabled', q.encryption_enabled,
                       'namespace', q.namespace,
                       'task', q.task)
              FROM stile.queues q
             WHERE q.name = p_queue);
END
$$;

-- Checks one option and returns the value to store: the key's default for a
-- JSON null, integers normalised (5.0 -> 5). Refuses, naming the key in the
-- message and in the error's COLUMN field, an unknown key or a bad value.
CREATE OR REPLACE FUNCTION stile.check_option(p_key text, p_value jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_defaults jsonb := stile.option_defaults();
    v_type text := jsonb_typeof(p_value);
    v_num numeric;
    v_least integer;  -- the least value the option takes
BEGIN
    IF NOT v_defaults ? p_key THEN
        RAISE EXCEPTION '%: unknown option (known: %)', p_key,
                (SELECT string_agg(k, ', ' ORDER BY k) FROM jsonb_object_keys(v_defaults) AS k)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = p_key;
    END IF;
    IF p_value IS NULL OR v_type = 'null' THEN
        RETURN v_defaults -> p_key;
    END IF;
    IF p_key = 'encryptionEnabled' THEN
        IF v_type <> 'boolean' THEN
            RAISE EXCEPTION '%: must be a boolean, got %', p_key, p_value
                USING ERRCODE = 'invalid_parameter_value', COLUMN = p_key;
        END IF;
        RETURN p_value;
    END IF;
    IF p_key IN ('namespace', 'task') THEN
        IF v_type <> 'string' THEN
            RAISE EXCEPTION '%: must be a string or null, got %', p_key, p_value
                USING ERRCODE = 'invalid_parameter_value', COLUMN = p_key;
        END IF;
        RETURN p_value;
    END IF;
    -- Every other option is a whole number of seconds or a count.
    IF v_type <> 'number' THEN
        RAISE EXCEPTION '%: must be an integer, got %', p_key, p_value
            USING ERRCODE = 'invalid_parameter_value', COLUMN = p_key;
    END IF;
    v_num := p_value::numeric;
    v_least := CASE WHEN p_key = 'priority' THEN -2147483648 ELSE 0 END;
    IF v_num <> trunc(v_num) OR v_num > 2147483647 OR v_num < v_least THEN
        RAISE EXCEPTION '%: must be an integer from % to 2147483647, got %', p_key, v_least, p_value
            USING ERRCODE = 'invalid_parameter_value', COLUMN = p_key;
    END IF;
    RETURN to_jsonb(v_num::integer);
END
$$;

-- Copies a queue's window to each of its partitions whose copy differs, in
-- the configuring transaction, which holds the queue's window lock: a
-- partition created meanwhile waits for it (stile.queue_window_lock in
-- stile.resolve_partition) and takes the window committed with it. The partitions'
-- row locks are taken one statement each, in ascending id order (the one
-- global lock order, see partitions.sql); a push holds its partitions' locks
-- while it decides, so it decides under one window, the one before the
-- change or the one after. One statement per row also keeps each lock on one
-- shard when the table is distributed (Citus refuses FOR UPDATE over
-- several).
CREATE OR REPLACE FUNCTION stile.partitions_take_window(p_queue text, p_window integer)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_id bigint;
BEGIN
    FOR v_id IN SELECT n.id FROM stile.partition_names n WHERE n.queue = p_queue ORDER BY n.id LOOP
        UPDATE stile.partitions p
           SET dedup_window_seconds = p_window
         WHERE p.id = v_id AND p.dedup_window_seconds IS DISTINCT FROM p_window;
    END LOOP;
END
$$;

-- Configures a queue and returns its stored options. A new queue starts from
-- the defaults. Merge (p_replace false) leaves omitted keys alone; replace
-- resets every omitted key to its default; in both, an explicit JSON null
-- restores that key's default. Every key is checked before anything is
-- written, and one bad key refuses the whole call.
CREATE OR REPLACE FUNCTION stile.configure(p_queue text, p_options jsonb, p_replace boolean DEFAULT false)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_given jsonb := '{}';
    v_key text;
    v_value jsonb;
    v_new jsonb;
BEGIN
    IF p_options IS NOT NULL AND jsonb_typeof(p_options) <> 'object' THEN
        RAISE EXCEPTION 'options: must be a JSON object, got %', jsonb_typeof(p_options)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'options';
    END IF;
    FOR v_key, v_value IN SELECT e.key, e.value FROM jsonb_each(coalesce(p_options, '{}')) AS e LOOP
        v_given := v_given || jsonb_build_object(v_key, stile.check_option(v_key, v_value));
    END LOOP;

    INSERT INTO stile.queues (name) VALUES (p_queue) ON CONFLICT DO NOTHING;
    PERFORM stile.queue_window_lock(p_queue, true);
    PERFORM 1 FROM stile.queues WHERE name = p_queue FOR NO KEY UPDATE;
    IF coalesce(p_replace, false) THEN
        v_new := stile.option_defaults() || v_given;
    ELSE
        v_new := stile.queue_options_of(p_queue) || v_given;
    END IF;
    UPDATE stile.queues
       SET dedup_window_seconds = (v_new ->> 'dedupWindowSeconds')::integer,
           retention_seconds = (v_new ->> 'retentionSeconds')::integer,
           lease_time = (v_new ->> 'leaseTime')::integer,
           retry_limit = (v_new ->> 'retryLimit')::integer,
           priority = (v_new ->> 'priority')::integer,
           delayed_processing = (v_new ->> 'delayedProcessing')::integer,
           window_buffer = (v_new ->> 'windowBuffer')::integer,
           max_size = (v_new ->> 'maxSize')::integer,
           completed_retention_seconds = (v_new ->> 'completedRetentionSeconds')::integer,
           encryption_enabled = (v_new ->> 'encryptionEnabled')::boolean,
           namespace = v_new ->> 'namespace',
           task = v_new ->> 'task',
           updated_at = now()
     WHERE name = p_queue;
    -- Every time, not only when the window changes: a copy that differs
    -- (a window written by plain SQL) is put right by the next configure.
    PERFORM stile.partitions_take_window(p_queue, (v_new ->> 'dedupWindowSeconds')::integer);
    RETURN stile.queue_options_of(p_queue);
END
$$;

