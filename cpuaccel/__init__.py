"""cpuaccel: provision, sync and launch distributed PyTorch training on Intel Xeon clusters."""

__version__ = "0.1.0"
