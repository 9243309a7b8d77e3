\set r random(0, 298)
SELECT base_offset - 1 AS f, encode(substring(hashes FROM 1 FOR 160), 'hex') AS h FROM stile.log WHERE partition_id = 1 ORDER BY end_offset OFFSET :r LIMIT 1 \gset
SELECT * FROM stile.probe(1, :f, 29999, 3600, now(), decode(':h', 'hex'), true, NULL);
