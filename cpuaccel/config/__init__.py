"""Configuration: the project file (cpuaccel.yaml), Accelerate's default_config.yaml,
plain MPI hostfiles, the ``cpuaccel config`` questionnaire, and where each effective
setting came from."""
