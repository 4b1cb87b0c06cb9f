"""``cpuaccel bench net``: the network between the nodes measured by a job of one rank
a node. ``job`` is the rank side (torch, mpi4py); ``launching`` starts it and reads its
result; ``results`` checks that result and computes the rates; ``table`` prints them;
``sizes`` reads and writes message sizes."""
