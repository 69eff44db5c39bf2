"""Dial-backs: the protocol both sides share (`messages`), the helper's service that dials an
asker back (`service`), and the asker's client that asks helpers and judges their replies
(`client`). It imports what `swarm.nat` may."""
