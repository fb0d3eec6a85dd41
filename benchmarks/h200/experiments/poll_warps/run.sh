#!/usr/bin/env bash
# Experiment: the ticket barrier polled by every warp, staggered (working tree, poll_warps.patch)
# against the committed kernel (.exp/old); see ../side_by_side.sh.
exec bash benchmarks/h200/experiments/side_by_side.sh poll --variant default --variant cuda_s16
