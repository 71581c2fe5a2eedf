"""Search: candidate enumeration, the stage-split ILP, placement, ranking, explanation."""
