from tidal.trainer.service import main

main()
