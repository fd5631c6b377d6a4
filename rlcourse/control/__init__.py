"""Control: Gymnasium agents, offline data sets in the D4RL layout, and test-time steering of frozen actors."""
