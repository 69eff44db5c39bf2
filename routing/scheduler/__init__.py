"""Placement: which peer serves which layers at which TP degree (HexGen, seeds 000/003)."""
