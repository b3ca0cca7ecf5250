from tidal.trainer.parallel.launch import main

main()
