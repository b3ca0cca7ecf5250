from tidal.weightsync.service import main

main()
