"""Results: the records a run writes, baselines, comparisons, merging and the HTML report."""
