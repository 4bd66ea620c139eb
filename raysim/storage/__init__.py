"""The files a run leaves on disk and how they survive faults: every write atomic (a temporary file renamed over
the target) and every read of a damaged file named in one line (`atomic`), and the checkpoints of server and
client states with the manifest of sizes and SHA-256 sums that resume checks (`checkpoint`)."""
