from cpuaccel.cli.main import main

main()
