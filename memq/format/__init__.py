"""memq.format"""
