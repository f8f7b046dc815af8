"""Share groups (KIP-932): pure delivery state and assignment, their store, and the broker's service."""
