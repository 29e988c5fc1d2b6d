"""How good continuations are: scored against the truth with baselines; metrics, control evidence,
novelty, sampling sweeps, reports."""
