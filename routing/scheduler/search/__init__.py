"""The placement search (HexGen §4.3): ``search`` (where every search starts and which one it
runs), ``search_result`` (what any search returns), the genetic search ``genetic`` with its
``ga_operators``, ``ga_fitness`` and ``sim_polish`` (the final pick by event simulation),
``hierarchical`` (region by region, for large clusters) and ``pinned_stages`` (around peers with a
fixed layer range)."""
