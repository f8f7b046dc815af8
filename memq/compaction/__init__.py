"""Compacted topics: the latest record per key, kept in compacted parts named by a manifest."""
