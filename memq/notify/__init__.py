"""memq.notify"""
