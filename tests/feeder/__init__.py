"""Tests of the feeder's side and the wire: the agent, the stream format, the transports."""
