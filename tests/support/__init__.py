"""Helpers shared by test files (never imported from a test_*.py file)."""
