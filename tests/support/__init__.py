"""Helpers shared by test files and benchmarks (never imported from a test_*.py file)."""
