"""Tests of the pure streaming transformer (transforms/)."""
