------------------------------------------------------------------------------
-- Keys: KV and once (applied with the other functions, see host/src/db/migrate.rs)
------------------------------------------------------------------------------

-- Applies KV operations in order, in the caller's transaction, and answers
-- {"results": [...], "failed": i}: one result per operation, and the index of
-- the first `required` operation that did not apply (null when none). The
-- caller rolls back when `failed` is set, so that nothing of the call is
-- written. An answer whose results grow past p_max_answer_bytes (as jsonb's
-- text, which is what PostgreSQL sends and never shorter than the gateway's
-- JSON of them; null for no bound) is refused under SQLSTATE SK002, naming
-- the operation that crossed it, before more is read: a getMany or getPrefix
-- stops reading its rows as soon as they pass what is left.
--
-- Operations arrive validated and normalised by the gateway (host/src/kv/):
-- "op" is one of get, getMany, getPrefix, check, put, putIfAbsent, delete,
-- incr; "ttl" is seconds or null for forever; "expect" is null, 0 (must not
-- exist) or a version. Every verdict is computed on the key's row under its
-- lock (SELECT ... FOR UPDATE), or, for an absent key, by an INSERT that a
-- concurrent creator makes wait: two callers racing one putIfAbsent from any
-- number of gateways get exactly one winner. The keys the writes name are
-- locked first, in the order of namespace and key, so that two calls writing
-- the same keys in other orders wait for each other instead of deadlocking.
CREATE OR REPLACE FUNCTION stile.kv_apply(p_ops jsonb, p_max_answer_bytes bigint)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_results jsonb[] := '{}';
    v_bytes bigint := 0;
    v_failed integer;
    v_result jsonb;
    v_op jsonb;
    v_written record;
BEGIN
    -- A call of one operation (a once, most often) locks its one key as it
    -- applies it.
    IF jsonb_array_length(p_ops) > 1 THEN
        FOR v_written IN
            SELECT DISTINCT (o ->> 'ns') COLLATE "C" AS ns, (o ->> 'key') COLLATE "C" AS key
              FROM jsonb_array_elements(p_ops) o
             WHERE o ->> 'op' NOT IN ('get', 'getMany', 'getPrefix')
             ORDER BY ns, key
        LOOP
            PERFORM stile.kv_lock(v_written.ns, v_written.key, v_now);
        END LOOP;
    END IF;
    FOR i IN 0 .. jsonb_array_length(p_ops) - 1 LOOP
        v_op := p_ops -> i;
        v_result := CASE v_op ->> 'op'
            WHEN 'get' THEN stile.kv_get(v_op, v_now)
            WHEN 'getMany' THEN stile.kv_get_many(v_op, v_now, p_max_answer_bytes - v_bytes)
            WHEN 'getPrefix' THEN stile.kv_get_prefix(v_op, v_now, p_max_answer_bytes - v_bytes)
            ELSE stile.kv_write(v_op, v_now)
        END;
        -- A getMany or getPrefix whose rows passed what was left of the
        -- bound answered NULL, and so does this.
        v_result := jsonb_build_object('index', i) || v_result;
        -- The result's text and the comma before it.
        v_bytes := v_bytes + octet_length(v_result::text) + 1;
        IF v_result IS NULL OR v_bytes > p_max_answer_bytes THEN
            RAISE EXCEPTION USING ERRCODE = 'SK002',
                MESSAGE = format('operations[%s]: the answer would exceed the limit of %s bytes', i, p_max_answer_bytes);
        END IF;
        v_results := v_results || v_result;
        IF v_failed IS NULL AND (v_op ->> 'required')::boolean AND NOT (v_result ->> 'applied')::boolean THEN
            v_failed := i;
        END IF;
    END LOOP;
    RETURN jsonb_build_object('results', to_jsonb(v_results), 'failed', v_failed);
END
$$;

-- kv_apply without a bound on its answer, for gateways of an earlier build.
CREATE OR REPLACE FUNCTION stile.kv_apply(p_ops jsonb)
RETURNS jsonb
LANGUAGE sql
AS $$ SELECT stile.kv_apply(p_ops, NULL) $$;

-- kv_apply as one statement of its own (the standalone KV route): when a
-- required operation did not apply, the answer is raised as the error's
-- message under SQLSTATE SK001, which aborts the statement and with it every
-- write of the call, in one round trip.
CREATE OR REPLACE FUNCTION stile.kv_apply_atomic(p_ops jsonb, p_max_answer_bytes bigint)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_answer jsonb := stile.kv_apply(p_ops, p_max_answer_bytes);
BEGIN
    IF v_answer ->> 'failed' IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SK001', MESSAGE = v_answer::text;
    END IF;
    RETURN v_answer;
END
$$;

-- kv_apply_atomic without a bound on its answer, for gateways of an earlier
-- build.
CREATE OR REPLACE FUNCTION stile.kv_apply_atomic(p_ops jsonb)
RETURNS jsonb
LANGUAGE sql
AS $$ SELECT stile.kv_apply_atomic(p_ops, NULL) $$;

-- A key's row as the API shows it. Times are ms since the epoch.
CREATE OR REPLACE FUNCTION stile.kv_row(p_key text, p_value jsonb, p_version bigint, p_expires timestamptz, p_updated timestamptz)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT jsonb_build_object(
        'key', p_key, 'value', p_value, 'version', p_version,
        'expiresAt', floor(extract(epoch FROM p_expires) * 1000)::bigint,
        'updatedAt', floor(extract(epoch FROM p_updated) * 1000)::bigint)
$$;

-- The three reads are PL/pgSQL, not LANGUAGE sql: their bodies hold
-- sub-selects, which the planner never inlines, and a LANGUAGE sql function
-- that is not inlined is parsed and planned again in every transaction that
-- calls it (each KV request), where PL/pgSQL keeps its plans for the session.

CREATE OR REPLACE FUNCTION stile.kv_get(p_op jsonb, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN coalesce(
        (SELECT jsonb_build_object('op', 'get', 'found', true)
                || stile.kv_row(k.key, k.value, k.version, k.expires_at, k.updated_at)
           FROM stile.kv k
          WHERE k.ns = p_op ->> 'ns' AND k.key = (p_op ->> 'key') COLLATE "C"
            AND (k.expires_at IS NULL OR k.expires_at > p_now)),
        jsonb_build_object('op', 'get', 'found', false, 'key', p_op ->> 'key'));
END
$$;

-- The keys' rows in the order asked, and the keys not found. NULL once
-- they pass p_max_bytes as jsonb's text (null: no bound), the keys after
-- that one left unread.
DROP FUNCTION IF EXISTS stile.kv_get_many(jsonb, timestamptz);
CREATE OR REPLACE FUNCTION stile.kv_get_many(p_op jsonb, p_now timestamptz, p_max_bytes bigint)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_ns text := p_op ->> 'ns';
    v_rows jsonb[] := '{}';
    v_missing jsonb[] := '{}';
    v_bytes bigint := 0;
    v_key text COLLATE "C";
    v_row jsonb;
BEGIN
    FOR v_key IN
        SELECT w.key FROM jsonb_array_elements_text(p_op -> 'keys') WITH ORDINALITY AS w(key, n) ORDER BY w.n
    LOOP
        SELECT stile.kv_row(k.key, k.value, k.version, k.expires_at, k.updated_at) INTO v_row
          FROM stile.kv k
         WHERE k.ns = v_ns AND k.key = v_key AND (k.expires_at IS NULL OR k.expires_at > p_now);
        IF FOUND THEN
            v_rows := v_rows || v_row;
        ELSE
            v_row := to_jsonb(v_key);
            v_missing := v_missing || v_row;
        END IF;
        v_bytes := v_bytes + octet_length(v_row::text) + 1;
        IF v_bytes > p_max_bytes THEN
            RETURN NULL;
        END IF;
    END LOOP;
    RETURN jsonb_build_object('op', 'getMany', 'rows', to_jsonb(v_rows), 'missing', to_jsonb(v_missing), 'truncated', false);
END
$$;

-- The least text above every key that starts with p_prefix, in byte order
-- (COLLATE "C", in which UTF-8 text sorts by code point): the prefix with its
-- last character that has a successor replaced by that successor, and the
-- characters after it dropped. Keys are at most 1,024 bytes, so for a prefix
-- made only of the greatest character, 257 of it lie above every key.
CREATE OR REPLACE FUNCTION stile.prefix_end(p_prefix text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    v_greatest integer := CASE WHEN getdatabaseencoding() = 'UTF8' THEN 1114111 ELSE 255 END;
    v_cut integer := char_length(p_prefix);
    v_code integer;
BEGIN
    WHILE v_cut > 0 LOOP
        v_code := ascii(substr(p_prefix, v_cut, 1));
        IF v_code < v_greatest THEN
            -- U+D800 to U+DFFF are not characters: U+E000 follows U+D7FF.
            RETURN left(p_prefix, v_cut - 1)
                   || chr(CASE WHEN v_code = 55295 AND v_greatest = 1114111 THEN 57344 ELSE v_code + 1 END);
        END IF;
        v_cut := v_cut - 1;
    END LOOP;
    RETURN repeat(chr(v_greatest), 257);
END
$$;

-- A page of the keys starting with "prefix", after "after", in byte order:
-- "limit" rows and whether more follow ("nextAfter" is the last key given).
-- NULL once its rows pass p_max_bytes as jsonb's text (null: no bound), the
-- keys after that one left unread.
-- The keys' range is bounded on both sides by plain comparisons, which a
-- cached generic plan still scans the index by (it cannot derive a range
-- from ^@ with a value it does not know): a short page of a large namespace
-- reads the prefix's keys, not every key after them. ^@ stays the test of
-- each key; the bounds only say where the scan starts and stops. Sorts are
-- off for the call, so that the keys come in the index's order, one at a
-- time, and none is read past the bound.
DROP FUNCTION IF EXISTS stile.kv_get_prefix(jsonb, timestamptz);
CREATE OR REPLACE FUNCTION stile.kv_get_prefix(p_op jsonb, p_now timestamptz, p_max_bytes bigint)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET enable_sort = off
AS $$
DECLARE
    v_prefix text COLLATE "C" := p_op ->> 'prefix';
    v_end text COLLATE "C" := stile.prefix_end(v_prefix);
    v_limit integer := (p_op ->> 'limit')::integer;
    v_keys_only boolean := (p_op ->> 'keysOnly')::boolean;
    v_rows jsonb[] := '{}';
    v_bytes bigint := 0;
    v_more boolean := false;
    v_last text;
    v_key record;
    v_row jsonb;
BEGIN
    FOR v_key IN
        SELECT k.key, k.value, k.version, k.expires_at, k.updated_at FROM stile.kv k
         WHERE k.ns = p_op ->> 'ns'
           AND k.key >= v_prefix AND k.key < v_end AND k.key ^@ v_prefix
           AND k.key > coalesce(p_op ->> 'after', '') COLLATE "C"
           AND (k.expires_at IS NULL OR k.expires_at > p_now)
         ORDER BY k.key
         LIMIT v_limit + 1
    LOOP
        IF cardinality(v_rows) >= v_limit THEN
            v_more := true;
            EXIT;
        END IF;
        v_row := CASE WHEN v_keys_only
                      THEN jsonb_build_object('key', v_key.key, 'version', v_key.version)
                      ELSE stile.kv_row(v_key.key, v_key.value, v_key.version, v_key.expires_at, v_key.updated_at) END;
        v_bytes := v_bytes + octet_length(v_row::text) + 1;
        IF v_bytes > p_max_bytes THEN
            RETURN NULL;
        END IF;
        v_rows := v_rows || v_row;
        v_last := v_key.key;
    END LOOP;
    RETURN jsonb_build_object('op', 'getPrefix', 'rows', to_jsonb(v_rows), 'truncated', v_more,
                              'nextAfter', CASE WHEN v_more THEN v_last END);
END
$$;

-- A key's row, locked; when there is none, a placeholder that holds the key
-- for this transaction (version 0, expired: absent to every reader; a
-- concurrent creator waits on it, then finds it).
CREATE OR REPLACE FUNCTION stile.kv_lock(p_ns text, p_key text, p_now timestamptz)
RETURNS stile.kv
LANGUAGE plpgsql
AS $$
DECLARE
    v_key text COLLATE "C" := p_key;
    v_row stile.kv;
BEGIN
    LOOP
        SELECT * INTO v_row FROM stile.kv WHERE ns = p_ns AND key = v_key FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO stile.kv (ns, key, value, version, expires_at, updated_at)
        VALUES (p_ns, v_key, 'null', 0, '-infinity', p_now)
        ON CONFLICT DO NOTHING
        RETURNING * INTO v_row;
        EXIT WHEN FOUND;
    END LOOP;
    RETURN v_row;
END
$$;

-- check, put, putIfAbsent, delete and incr: the verdict on the key's locked
-- row (or on its locked absence), then the write.
CREATE OR REPLACE FUNCTION stile.kv_write(p_op jsonb, p_now timestamptz)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_kind text := p_op ->> 'op';
    v_shown text := CASE v_kind WHEN 'putIfAbsent' THEN 'put' ELSE v_kind END;
    v_ns text := p_op ->> 'ns';
    v_key text COLLATE "C" := p_op ->> 'key';
    v_expect bigint := (p_op ->> 'expect')::bigint;
    v_expires timestamptz := p_now + make_interval(secs => (p_op ->> 'ttl')::double precision);
    v_row stile.kv;
    v_live boolean;
    v_reason text;
    v_value jsonb;
    v_version bigint;
    v_sum numeric;
BEGIN
    v_row := stile.kv_lock(v_ns, v_key, p_now);
    v_live := v_row.version > 0 AND (v_row.expires_at IS NULL OR v_row.expires_at > p_now);

    v_reason := CASE
        WHEN v_expect = 0 AND v_live THEN 'exists'
        WHEN v_expect > 0 AND NOT v_live THEN 'absent'
        WHEN v_expect > 0 AND v_row.version <> v_expect THEN 'version'
        WHEN v_kind = 'putIfAbsent' AND v_live THEN 'exists'
        WHEN v_kind = 'delete' AND NOT v_live THEN 'absent'
        WHEN v_kind = 'check' AND v_expect IS NULL AND NOT v_live THEN 'absent'
    END;
    -- A counter is an integer a bigint holds: the gateway reads a value's
    -- numbers as 64-bit integers or doubles, so a sum outside that range
    -- would be stored but read back rounded (an increment nobody sees).
    -- Such a value is not a counter ('type'), and a sum that would leave the
    -- range is past a limit ('limit').
    IF v_reason IS NULL AND v_kind = 'incr' THEN
        IF v_live AND jsonb_typeof(v_row.value) IS DISTINCT FROM 'number' THEN
            v_reason := 'type';
        ELSE
            v_sum := CASE WHEN v_live THEN (v_row.value #>> '{}')::numeric ELSE 0 END;
            IF v_sum <> trunc(v_sum) OR v_sum NOT BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
                v_reason := 'type';
            ELSE
                v_sum := v_sum + (p_op ->> 'delta')::numeric;
                IF v_sum < (p_op ->> 'min')::numeric OR v_sum > (p_op ->> 'max')::numeric
                   OR v_sum NOT BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
                    v_reason := 'limit';
                END IF;
            END IF;
        END IF;
    END IF;

    IF v_reason IS NOT NULL OR v_kind = 'check' THEN
        IF NOT v_live THEN
            -- Nothing to show, and the placeholder (if this call made it) must go.
            DELETE FROM stile.kv WHERE ns = v_ns AND key = v_key AND version = 0;
            RETURN jsonb_strip_nulls(jsonb_build_object('op', v_shown, 'key', v_key, 'applied', v_reason IS NULL, 'reason', v_reason));
        END IF;
        RETURN jsonb_build_object('op', v_shown, 'key', v_key, 'applied', v_reason IS NULL, 'value', v_row.value, 'version', v_row.version)
               || CASE WHEN v_reason IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('reason', v_reason) END;
    END IF;

    IF v_kind = 'delete' THEN
        DELETE FROM stile.kv WHERE ns = v_ns AND key = v_key;
        RETURN jsonb_build_object('op', v_shown, 'key', v_key, 'applied', true, 'version', v_row.version);
    END IF;

    v_value := CASE WHEN v_kind = 'incr' THEN to_jsonb(v_sum) ELSE p_op -> 'value' END;
    -- A put sets the expiry it carries; an increment of a live counter keeps
    -- the one its window started with, so that a limiter's window closes
    -- however busy its caller is.
    IF v_kind = 'incr' AND v_live THEN
        v_expires := v_row.expires_at;
    END IF;
    -- Drawn into a variable: Citus refuses a volatile function (or a
    -- volatile default) in an UPDATE of a distributed table.
    v_version := nextval('stile.kv_versions');
    UPDATE stile.kv
       SET value = v_value, version = v_version, expires_at = v_expires, updated_at = p_now
     WHERE ns = v_ns AND key = v_key;
    RETURN jsonb_build_object('op', v_shown, 'key', v_key, 'applied', true, 'value', v_value, 'version', v_version);
END
$$;

-- Deletes up to p_limit keys whose time has passed; answers how many. The
-- candidates are read without locks, then each is deleted by its own
-- statement, which names one key (one shard when the table is distributed)
-- and skips a key a writer holds or has made live again since.
CREATE OR REPLACE FUNCTION stile.kv_purge(p_limit integer)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_deleted bigint := 0;
    v_now timestamptz := clock_timestamp();
    c record;
BEGIN
    FOR c IN SELECT e.ns, e.key FROM stile.kv e
              WHERE e.expires_at <= v_now
              ORDER BY e.expires_at LIMIT p_limit
    LOOP
        PERFORM 1 FROM stile.kv l
          WHERE l.ns = c.ns AND l.key = c.key AND l.expires_at <= v_now
            FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        DELETE FROM stile.kv k WHERE k.ns = c.ns AND k.key = c.key;
        v_deleted := v_deleted + 1;
    END LOOP;
    RETURN v_deleted;
END
$$;
