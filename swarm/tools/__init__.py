"""What every process of ours uses and nothing of ours: logging (`log_setup`), thread settings
(`threads`), the open-files limit (`open_files`), the model cache's files (`cache_files`), text safe for a terminal (`terminal_text`), a
command's fast start and end (`lazy_hivemind`, `fast_exit`), and the local swarms of processes
that the demo, the tests and the benchmarks start (`launcher`, `chaos`). It imports no other part
of `hexswarm.swarm`."""
