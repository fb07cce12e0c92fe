"""The superhub's schema file: read a feeder's `pg_dump --schema-only` output and build partitioned parents from it.

The file is parsed with PostgreSQL's own grammar (pglast, libpg_query) and never run: each statement executed is built
from the parse tree by fedload (`build.py`) and written back by pglast's deparser, checked to parse back to the same
tree. Created: the extensions, enums, domains and sequences the wanted tables use, and each wanted table partitioned BY
LIST on the feeder key, with everything that shapes its rows as written (identity, NOT NULLs named or not; defaults;
collations; generated columns, stored or virtual; CHECKs, NOT VALID and NOT ENFORCED as written; primary keys, unique
and exclusion constraints, WITHOUT OVERLAPS, widened by the feeder key; indexes with their operator classes). Everything
else (views, materialized views, foreign keys, functions, triggers, rules, policies, publications, grants, owners,
comments...) is left out and listed in one warning.

- `parents.py`: the file read and checked, and the missing parents created from it (the names handed on here).
- `model.py`: what fedload keeps of the file: parse-tree nodes with the line each came from.
- `read.py`: the statements read with PostgreSQL's grammar, each into the model or listed as left out.
- `needs.py`: what a table needs: types, sequences, extensions, and the PostgreSQL version of its clauses.
- `build.py`: the statements that create the parents, built from the trees and checked to parse back to them.
"""

from fedload.superhub.schema_file.parents import (
    SchemaFile,
    check_schema_file,
    create_parents_from_file,
    read_schema_file,
    schema_file_refusals,
)

__all__ = ["SchemaFile", "check_schema_file", "create_parents_from_file", "read_schema_file", "schema_file_refusals"]
