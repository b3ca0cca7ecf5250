from tidal.common.process.fast_exit import run_and_exit
from tidal.orchestrator.main import main

run_and_exit(main)
