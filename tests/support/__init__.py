<<<<<<< HEAD
"""Helpers shared by test files and benchmarks (never imported from a test_*.py file)."""
=======
"""Helpers shared by the test files (never imported from one test file into another)."""
>>>>>>> s-speed
