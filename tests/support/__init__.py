"""Typed fakes and helpers shared by tests: import them from here, never from another test module."""
