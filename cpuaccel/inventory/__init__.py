"""The inventory: which hosts to run on and their variables.

``inventory`` is what the rest of cpuaccel uses (load, --limit, -e); the sources
``ansible_yaml`` (an Ansible YAML inventory) and ``hostfile`` (a plain MPI hostfile) fill
a ``builder``, which merges variables with Ansible's precedence; ``patterns`` reads host
ranges and --limit patterns; ``host`` is one host and its connection settings.
"""
