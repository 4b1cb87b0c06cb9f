"""Configuration: the project file (cpuaccel.yaml), Accelerate's default_config.yaml,
the ``cpuaccel config`` questionnaire, and where each effective setting came from.
(MPI hostfiles are an inventory source: :mod:`cpuaccel.inventory.hostfile`.)"""
