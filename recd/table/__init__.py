"""The stored table: partitions, Hive and Iceberg commits, snapshots, migration, the dedup
layout. The ETL writes through here; readers, analyze and the benchmarks read through here."""
