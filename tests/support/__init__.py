"""Typed fakes and helpers shared by test modules (instead of importing one test module from another)."""
