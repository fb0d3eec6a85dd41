#!/usr/bin/env bash
# Experiment: half of the softmax exponentials by a polynomial on the FMA pipe (working tree,
# poly_exp2.patch) against the committed kernel (.exp/old); see ../side_by_side.sh.
exec bash benchmarks/h200/experiments/side_by_side.sh poly --variant default
