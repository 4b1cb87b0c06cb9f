"""cpuaccel provision: the playbook engine and what it ships to the nodes."""
