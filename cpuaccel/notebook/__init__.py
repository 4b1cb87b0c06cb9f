"""A notebook cell's function run on every rank: ``cpuaccel.notebook.launch``."""
