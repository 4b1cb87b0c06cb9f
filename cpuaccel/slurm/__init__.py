"""Slurm: allocations, batch jobs and partitions, read and driven through Slurm's own
client commands (``srun``, ``sbatch``, ``squeue``, ``sacct``, ``scancel``, ``sinfo``,
``scontrol``), each run bounded by :mod:`cpuaccel.slurm.commands`."""
