"""memq.client"""
