"""memq.devcluster"""
