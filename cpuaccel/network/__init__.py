"""The job's network: which address and interface each node's ranks talk over, and what
is wrong with it."""
