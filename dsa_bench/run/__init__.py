"""Running a workload: the plan, the isolated solution workers, and the judging side."""
