from tidal.common.process.fast_exit import run_and_exit
from tidal.orchestrator.service import main

run_and_exit(main)
