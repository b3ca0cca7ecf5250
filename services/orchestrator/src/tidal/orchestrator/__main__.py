from tidal.orchestrator.service import main

main()
