"""The layout of one pipeline (HexGen §4.2, Algorithm 1): ``layer_split`` (how many layers each
stage gets), ``algorithm1`` (the DP over GPU-set vectors) and ``pipeline_dp`` (its tables and the
`PipelineLayout` it returns), on which every search and score of a plan stands."""
