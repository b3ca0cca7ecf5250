from tidal.common.process.fast_exit import run_and_exit
from tidal.weightsync.service import main

run_and_exit(main)
