"""A fault harness across hosts: network-namespace topology, seeded nemesis, workload, checker."""
