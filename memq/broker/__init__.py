"""memq.broker"""
