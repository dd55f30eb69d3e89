"""Fixture: a throwaway PostgreSQL server (see tests/harness/postgres.py)."""
