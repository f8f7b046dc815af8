"""memq.governor"""
