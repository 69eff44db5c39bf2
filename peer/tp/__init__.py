"""A peer's tensor-parallel group: the leader (`group`) and its stacks (`blocks`), the rank
processes (`rank`, started by `launch`), what they tell each other (`messages`), the collectives
(`collectives`), each rank's slice of the weights (`shard`), liveness and failure (`liveness`,
`failure`), uneven splits and their drift check (`profile`, `partition`, `windows`, `rebalance`).
It imports from the peer's own modules (`blocks`, `devices`), `swarm/` and `routing/`, never
from `peer/edge/` (docs/architecture.md "The groups' parts")."""
