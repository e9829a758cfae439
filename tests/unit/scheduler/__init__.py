"""Unit tests of the scheduler domain."""
