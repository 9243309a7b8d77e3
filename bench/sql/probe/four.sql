\set r random(0, 298)
SELECT encode(substring(hashes FROM 17 FOR 48), 'hex') AS h FROM stile.log WHERE partition_id = 1 ORDER BY end_offset OFFSET :r LIMIT 1 \gset
SELECT * FROM stile.probe(1, -1, 29999, 3600, now(), decode(':h', 'hex'), false, NULL);
