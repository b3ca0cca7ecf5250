from tidal.inference.service import main

main()
