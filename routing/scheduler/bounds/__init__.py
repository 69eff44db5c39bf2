"""What a cluster could serve at most, and how close a plan comes: ``bound_lp`` (the linear program
both bounds share), ``upper_bound`` (the most tokens/s of any placement), ``slo_bound`` (the most
within the SLO) and ``capacity`` (a plan's own tokens/s under a saturating load, set against them)."""
