"""What this repository's tests and benches share, beside the test bed (cpuaccel.testbed):
running cpuaccel as a user would, fake run records, a browser, shaped and faulty links.
Not part of the installed package."""
