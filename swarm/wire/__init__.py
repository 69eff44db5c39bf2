"""The wire protocol between clients and peers: the messages (`protocol`), their encoding and the
frames on a stream (`frames`), field checks and tensor encoding (`checks`, `tensors`), and the step
commitments that travel in them (`commitments`). It imports no other part of `hexswarm.swarm`."""
