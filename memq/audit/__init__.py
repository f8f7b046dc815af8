"""memq.audit"""
