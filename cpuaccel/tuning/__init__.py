"""``cpuaccel tune``'s engine: the grid of settings tried (``grid``), what each trial
measured and the best of them (``measure``), the best written into cpuaccel.yaml
(``write``), and what the nodes offer (``survey``: cores, allocators)."""
