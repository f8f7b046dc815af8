"""Spark DataSource "memq"."""
