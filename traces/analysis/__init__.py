"""Pure analysis over trace DataFrames: metrics, explanations, breakdowns, what-if, alignment. Never imports the run area."""
