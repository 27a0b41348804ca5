"""Replication: the wire, the sans-IO cores (master_slave/; isr/ and raft/ to come) and
the drivers that run them (DESIGN §5)."""
