"""A cluster of real hosts on one machine to try cpuaccel on: network namespaces on a bridge,
each with its own sshd, hostname, /etc/hosts and folder, and optionally Slurm
(``python -m cpuaccel.testbed up|down|status``; docs/testbed.md)."""
