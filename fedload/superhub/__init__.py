"""The superhub's load path: receive a feeder's stream, import it into staging tables, swap them in, and the run
history around it."""
