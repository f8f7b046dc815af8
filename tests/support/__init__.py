"""Typed fakes and helpers shared by tests: import them from here (`tests.support.<module>`), never from another test module."""
