"""Tests of fedload/localpg/: the root-owned copy of an install the server's account cannot reach."""
