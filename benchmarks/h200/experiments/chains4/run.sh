#!/usr/bin/env bash
# Experiment: four q_nope accumulator chains per warp (working tree, chains4.patch applied to
# 5a9becf) against the committed kernel (.exp/old = `git archive 5a9becf | tar -x -C .exp/old`);
# see ../side_by_side.sh. (The recorded phases.txt came from `profile_kernels.py phases
# --iterations 20` over every case; the shared runner stamps T = 1 sparse and T = 8 full.)
exec bash benchmarks/h200/experiments/side_by_side.sh chains4 --variant default --variant cuda_s16 --variant cuda_s32
