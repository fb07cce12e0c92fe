"""Pure streaming transformer for pg_dump plain-format output: bytes in, bytes out."""
