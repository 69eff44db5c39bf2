"""The DHT node and what reaching others takes: starting hivemind's node (`dht`, its process in
`dht_process`), reading it with a deadline (`dht_read`), this node's key and peer id (`identity`),
multiaddrs (`maddrs`) and dialing the addresses a record lists (`dialing`). It imports from
`swarm.tools` only."""
