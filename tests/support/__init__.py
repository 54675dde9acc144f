"""Helpers shared by test files and benchmarks (never imported from one test file into another)."""
