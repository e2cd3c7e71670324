"""verl-side reward plumbing: the ``interleaved`` reward manager and the step metrics it feeds."""
