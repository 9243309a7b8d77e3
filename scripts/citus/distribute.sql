-- stile's tables and push function distributed with Citus, applied on the
-- coordinator after the gateway has migrated the database
-- (scripts/citus/cluster.sh runs it; docs/scale-out.md says why each table
-- is what it is). tests/tests/db_migrate.rs checks the layout against this
-- file on plain PostgreSQL, so that the schema gains nothing Citus refuses.

-- Read when a partition is created and by configure: a copy on every node.
SELECT create_reference_table('stile.queues');

-- A partition's row lock serialises its pushes, and every read or write of
-- the log names one partition: both by the partition id, colocated.
SELECT create_distributed_table('stile.partitions', 'id');
SELECT create_distributed_table('stile.log', 'partition_id', colocate_with => 'stile.partitions');

-- Names resolve by queue and name; keys and timers are named by their
-- namespace and queue.
SELECT create_distributed_table('stile.partition_names', 'queue', colocate_with => 'none');
SELECT create_distributed_table('stile.timers', 'queue', colocate_with => 'stile.partition_names');
SELECT create_distributed_table('stile.kv', 'ns', colocate_with => 'none');

-- A bundle is delegated to the node holding its routing partition.
SELECT create_distributed_function(
    'stile.push(bigint, bigint[], bigint[], integer[], integer[], bytea[], bytea[], text[], text[], bigint, bytea[], boolean[])',
    'p_route', colocate_with => 'stile.partitions');
