"""Security: who a client is (tokens, TLS client certificates) and what it may do (ACLs).

The pure parts live here; the broker enforces them (memq.broker.server) and the clients
present credentials (memq.client._auth).
"""
