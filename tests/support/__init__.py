"""Helpers shared by the test files (never imported from one test file into another)."""
