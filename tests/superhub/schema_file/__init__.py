"""Tests of fedload/superhub/schema_file/: parents created from pg_dump --schema-only files of each major."""
