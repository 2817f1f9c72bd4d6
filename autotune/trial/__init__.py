"""What runs in a trial's own process, where the model file is imported and called: the
workload contract, the training set-up, the measurement protocol, the profiler and its
findings, the capability probe, and the child's side of the process boundary (`child`,
`server`, and `protocol`, the data that crosses it). Nothing here imports the tuner's side."""
