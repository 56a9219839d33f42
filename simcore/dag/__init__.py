"""Engine steps as DAGs of compute and communication, and their execution on the clock."""
