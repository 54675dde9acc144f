"""Helpers shared by tests and benchmarks (never imported from a test_*.py file by another)."""
