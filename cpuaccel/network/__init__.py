"""The nodes' network as a job meets it: the doctor that tries its connections."""
