"""memq.storage"""
