from tidal.common.process.fast_exit import run_and_exit
from tidal.trainer.launch import main

run_and_exit(main)
