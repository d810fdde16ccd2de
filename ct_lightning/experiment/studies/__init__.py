"""Studies of many runs: Table 1 reproductions, appendix grids, sweeps, consistency."""
