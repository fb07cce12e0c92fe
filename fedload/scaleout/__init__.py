"""Scale-out (docs/scale-out.md): the code that works on other databases than the superhub it loads, the coordinator
and the other shards. A reader of the load path can skip this package.

- `coordinator.py`: the coordinator built from the configuration (postgres_fdw servers, parents, foreign partitions).
- `placement.py`: which shard the coordinator reads each feeder from, and which shards it reads through a filter.
- `shard_side.py`: the coordinator's business on each shard: what it holds, the filter views it is read through.
- `entity_views.py`: with `superhub.entity_key`, the coordinator's views that hide the copies not at home (the
  decisions: `fedload.superhub.coordinated_entities`).

A shard's dsn as postgres_fdw options is `fedload/fdw_dsn.py`, one of the shared modules: the configuration checks
the shards' dsns with it. Names are imported from these modules, not re-exported here, so that reading a
configuration never brings asyncpg.
"""
