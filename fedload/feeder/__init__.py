"""The feeder's side: `fedload agent dump`, pg_dump through the transformer and a compressor, as a stream."""
