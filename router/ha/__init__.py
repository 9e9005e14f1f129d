"""Standby routers (issue 24): which router is active, by a lease row in the shared PostgreSQL store
(lease.py), and what a standby does until it holds the lease (standby.py)."""
