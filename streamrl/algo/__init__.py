"""The algorithm: advantage estimators, policy losses, the staleness rule, group filters, learning-signal statistics, MGRPO, difficulty filtering."""
