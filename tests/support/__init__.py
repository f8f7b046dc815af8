"""Typed fakes and helpers shared by tests (import from here, not from other test modules)."""
