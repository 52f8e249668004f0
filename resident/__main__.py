from resident.cli import main

main()
