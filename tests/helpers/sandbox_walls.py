"""Wall limits of sandbox tests, so a loaded shared machine fails only what is about time.

A test that checks what a program does (its output, its verdict, the limit that ended it)
runs it with ROOMY_WALL_S, a deadline no start on a busy machine reaches: at a lower CPU
priority than everything else, a program's start alone can take seconds there. A test of
the deadline itself keeps its own short one.
"""

ROOMY_WALL_S = 120.0
