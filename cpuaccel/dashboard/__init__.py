"""`cpuaccel dashboard`: the live run page, its server and what it reads of run folders."""
